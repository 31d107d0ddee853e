"""Host-device synchronisations, counted per call site and per training step.

Two sources, because neither alone sees them all:
- Python methods, wrapped: `Tensor.item`, `.tolist`, `.cpu`, `.numpy` (on a CPU tensor the
  last three dispatch nothing, so the dispatcher never hears of them), `.to(<cpu>)` of a
  device tensor on CUDA, and the explicit ones: `torch.cuda.synchronize`,
  `torch.accelerator.synchronize`, `torch.cuda.Event.synchronize`, `torch.cuda.Stream.synchronize`;
- operators at the dispatcher (fed by the tracker's dispatch mode) whose CUDA kernels read
  back to the host: `_local_scalar_dense` (a tensor used as a Python bool, int or float),
  `nonzero`, `masked_select`, boolean-mask indexing, `unique`, `repeat_interleave` without
  an output size, `equal`.
An operator reached from inside a wrapped method (`.item()` -> `_local_scalar_dense`) is the
same sync and is not counted twice. `F.one_hot` is wrapped on a CPU run: its CPU kernel reads
the index's min and max back as range checks, which its CUDA kernel skips when the class
count is given (it relies on scatter's device assert), so those reads are not counted; without
a class count CUDA reads the max once to size the result, and that one read is counted. On a CPU every call counts, since it is what would
synchronise if the loop ran on CUDA; on CUDA only calls on device tensors count. Calls made
while the DataLoader produces a batch work on host data and are left out.

Each sync is attributed to the frame that made it: when that frame is the target's own code
it is the target's sync; when it is inside a library the target called (GradScaler.step's
inf check), it is counted against the target line that called the library, marked as such.
On CUDA `torch.cuda.set_sync_debug_mode("warn")` cross-checks the count: its warnings
(which do not cover an explicit `torch.cuda.synchronize()`) are tallied per target line.
"""

from __future__ import annotations

import re
import threading
import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterator

import torch

from .clock import StepClock
from .frame_index import FrameIndex, Site, caller_frame
from ...harness.faults import call_original

aten = torch.ops.aten

# Operator packets whose CUDA implementation copies a value back to the host.
_DISPATCH_SYNCS: dict[Any, str] = {
    aten._local_scalar_dense: "scalar read (bool/int/float of a tensor)",
    aten.nonzero: "nonzero",
    aten.masked_select: "masked_select",
    aten.unique_consecutive: "unique",
    aten._unique: "unique",
    aten._unique2: "unique",
    aten.unique_dim: "unique",
    aten.equal: "equal",
    aten.is_nonzero: "scalar read (bool/int/float of a tensor)",
}
ONE_HOT_WITHOUT_CLASSES = "scalar read (one_hot without num_classes reads the largest class)"
_MASK_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
# Identities of every packet `on_dispatch` looks at: packets hash in Python, so the tracker's
# per-operator test is on their ids (each packet is one object for the process's life).
WATCHED_PACKETS = frozenset(id(p) for p in (*_DISPATCH_SYNCS, *_MASK_INDEXING, aten.repeat_interleave))
_SYNC_WARNING = re.compile(r"called a synchronizing CUDA operation")


@dataclass
class SyncRecord:
    kind: str
    explicit: bool
    site: Site | None
    direct: bool
    via: str
    per_step: dict[int, int] = field(default_factory=dict)
    before: int = 0

    def add(self, step: int | None) -> None:
        if step is None:
            self.before += 1
        else:
            self.per_step[step] = self.per_step.get(step, 0) + 1


class SyncCounter:
    """Counts syncs per (kind, call site) and per step interval."""

    def __init__(self, frames: FrameIndex, clock: StepClock) -> None:
        self.frames = frames
        self.clock = clock
        self.cuda_run = torch.cuda.is_available()
        self.records: dict[tuple[Any, ...], SyncRecord] = {}
        self.in_data = 0
        self.debug_warnings: dict[Site | None, dict[int, int]] = {}
        self._local = threading.local()
        self._originals: dict[str, Callable[..., Any]] = {}
        # On a CPU `.cpu()` returns its input; what it returns is host data from then on, as
        # it would be on CUDA, so `.cpu().numpy()` is one sync, not two.
        self._host_copies: dict[int, Any] = {}
        # On a CPU run, whether a tensor would be on the device in a CUDA run (the tracker
        # follows that); without a tracker every tensor counts.
        self.bound: Callable[[Any], bool] = lambda tensor: True
        self.mark_bound: Callable[[Any], None] = lambda tensor: None
        # Step intervals counted: all of them, unless `stop` ended counting at a boundary
        # (the instrumented window of a heavy loop); rates are taken over these only.
        self.recording = True
        self.steps_counted: int | None = None

    def steady(self, first: int, last: int) -> bool:
        """Whether every step interval in [first, last] made the same syncs, site by site."""
        patterns = {frozenset((key, r.per_step[step]) for key, r in self.records.items() if r.per_step.get(step)) for step in range(first, last + 1)}
        return len(patterns) <= 1

    def stop(self, completed: int) -> None:
        """Count nothing from step interval `completed` on."""
        self.recording = False
        self.steps_counted = completed

    # -- bookkeeping --------------------------------------------------------------------
    def _busy(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """The instruments' own reads (a loss value) are not the target's syncs."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def _own(self) -> bool:
        return getattr(self._local, "own", 0) > 0

    @contextmanager
    def _own_reads(self) -> Iterator[None]:
        """The instruments' own reads: not the target's, and not seen by the CUDA cross-check."""
        self._local.own = getattr(self._local, "own", 0) + 1
        try:
            with self.quiet():
                yield
        finally:
            self._local.own -= 1

    def read_scalar(self, tensor: torch.Tensor) -> float:
        """An instrument's read of a loss."""
        with self._own_reads():
            return float(self._originals.get("item", torch.Tensor.item)(tensor))

    def note(self, kind: str, explicit: bool) -> None:
        """Count one sync; its caller is the first frame above the instruments' own
        (which, like torch's dunder plumbing, are transparent to `FrameIndex.caller`)."""
        if not self.recording or not self.clock.mine():
            return
        if self.clock.in_data():
            self.in_data += 1
            return
        site, direct, via = self.frames.caller(caller_frame(2))
        key = (kind, explicit, site, direct, via)
        record = self.records.get(key)
        if record is None:
            record = self.records[key] = SyncRecord(kind, explicit, site, direct, via)
        record.add(self.clock.completed if self.clock.started else None)

    def _counts(self, tensor: Any) -> bool:
        """Whether a host read of `tensor` is a device sync (or would be one on CUDA)."""
        if not self.cuda_run:
            ref = self._host_copies.get(id(tensor))
            return (ref is None or ref() is not tensor) and self.bound(tensor)
        return isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu"

    def _mark_host_copy(self, tensor: Any) -> None:
        if self.cuda_run or not isinstance(tensor, torch.Tensor):
            return
        key = id(tensor)
        copies = self._host_copies
        try:
            def forget(_: object, key: int = key) -> None:
                copies.pop(key, None)

            copies[key] = weakref.ref(tensor, forget)
        except TypeError:
            pass

    # -- wrapped Python methods ---------------------------------------------------------
    def install(self) -> None:
        for name, kind in (("item", ".item()"), ("tolist", ".tolist()"), ("cpu", ".cpu()"), ("numpy", ".numpy()")):
            self._wrap_tensor_method(name, kind)
        self._wrap_to()
        self._wrap_explicit(torch.cuda, "synchronize", "torch.cuda.synchronize()")
        if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "synchronize"):
            self._wrap_explicit(torch.accelerator, "synchronize", "torch.accelerator.synchronize()")
        self._wrap_explicit(torch.cuda.Event, "synchronize", "Event.synchronize()")
        self._wrap_explicit(torch.cuda.Stream, "synchronize", "Stream.synchronize()")
        if self.cuda_run:
            self._install_sync_debug()
        else:
            self._wrap_one_hot()

    def _wrap_tensor_method(self, name: str, kind: str) -> None:
        original = getattr(torch.Tensor, name)
        self._originals[name] = original
        counter = self

        def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if counter._busy():
                return call_original(original, self, *args, **kwargs)
            if counter._counts(self):
                counter.note(kind, False)
            with counter.quiet():
                result = call_original(original, self, *args, **kwargs)
            if name == "cpu":
                counter._mark_host_copy(result)
            return result

        wrapper.__name__ = name
        wrapper.__qualname__ = f"Tensor.{name}"
        setattr(torch.Tensor, name, wrapper)

    def _wrap_to(self) -> None:
        original = torch.Tensor.to
        counter = self
        if not self.cuda_run:
            # On a CPU `.to(device)` moves nothing; what it returns is what would be on the
            # device. A literal "cpu" destination is the host, in any run.
            def to_on_cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                result = call_original(original, self, *args, **kwargs)
                if not counter._busy() and _to_device(args, kwargs):
                    counter.mark_bound(result)
                return result

            torch.Tensor.to = to_on_cpu  # type: ignore[method-assign,assignment]  # patched while the run lasts
            return

        def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if counter._busy() or self.device.type == "cpu" or not _to_host(args, kwargs):
                return call_original(original, self, *args, **kwargs)
            with counter.quiet():
                result = call_original(original, self, *args, **kwargs)
            # A non_blocking copy into pinned memory is queued on the stream: the host does not
            # wait (reading it before a synchronisation is the concurrency stage's race).
            if not (_non_blocking(args, kwargs) and isinstance(result, torch.Tensor) and result.is_pinned()):
                counter.note(".to('cpu')", False)
            return result

        torch.Tensor.to = to  # type: ignore[method-assign,assignment]

    def _wrap_one_hot(self) -> None:
        """On a CPU run, count what `one_hot` would read back on CUDA, not its CPU checks:
        nothing with a class count, the max once without (see aten's Onehot.cpp: on a CPU
        tensor it reads min and max; on CUDA only `max().item()` when num_classes is -1)."""
        functional = torch.nn.functional
        original = functional.one_hot
        counter = self

        def one_hot(tensor: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
            if counter._busy():
                return call_original(original, tensor, num_classes)
            if num_classes == -1 and counter._counts(tensor):
                counter.note(ONE_HOT_WITHOUT_CLASSES, False)
            with counter.quiet():
                return call_original(original, tensor, num_classes)

        one_hot.__name__ = "one_hot"
        one_hot.__doc__ = original.__doc__
        functional.one_hot = one_hot

    def _wrap_explicit(self, owner: Any, name: str, kind: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        counter = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not counter._busy():
                counter.note(kind, True)
            with counter.quiet():
                return call_original(original, *args, **kwargs)

        wrapper.__name__ = name
        setattr(owner, name, wrapper)

    # -- the dispatcher -----------------------------------------------------------------
    def on_dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Called by the tracker's dispatch mode for every operator, after it ran."""
        if not self.recording:
            return
        packet = func.overloadpacket
        kind = _DISPATCH_SYNCS.get(packet)
        if kind is None:
            if packet in _MASK_INDEXING and _has_mask_index(args):
                kind = "boolean-mask indexing"
            elif packet is aten.repeat_interleave and len(args) == 1 and kwargs.get("output_size") is None:
                kind = "repeat_interleave"
            else:
                return
        if self._busy():  # after the operator test: most operators are not syncs
            return
        operands = [a for a in args[:2] if isinstance(a, torch.Tensor)]
        if len(args) > 1 and isinstance(args[1], (list, tuple)):
            operands += [i for i in args[1] if isinstance(i, torch.Tensor)]
        if self.cuda_run:
            if not any(a.device.type != "cpu" for a in operands):
                return
        elif not any(self.bound(a) for a in operands):
            return
        self.note(kind, False)

    # -- CUDA cross-check ---------------------------------------------------------------
    def _install_sync_debug(self) -> None:
        torch.cuda.set_sync_debug_mode("warn")
        warnings.filterwarnings("always", message=".*called a synchronizing CUDA operation.*")
        previous = warnings.showwarning
        counter = self

        def showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if _SYNC_WARNING.search(str(message)):
                # Inside a wrapped call too (`.item()` warns from inside it): the cross-check
                # counts on its own; only the instruments' own reads are left out.
                if counter.recording and counter.clock.mine() and counter.clock.started and not counter.clock.in_data() and not counter._own():
                    site = counter.frames.innermost(caller_frame(2))
                    steps = counter.debug_warnings.setdefault(site, {})
                    steps[counter.clock.completed] = steps.get(counter.clock.completed, 0) + 1
                return
            previous(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning

    def collect(self) -> dict[str, Any]:
        return {
            "records": [
                {
                    "kind": r.kind,
                    "explicit": r.explicit,
                    "site": list(r.site) if r.site else None,
                    "direct": r.direct,
                    "via": r.via,
                    "per_step": {str(k): v for k, v in sorted(r.per_step.items())},
                    "before_training": r.before,
                }
                for r in self.records.values()
            ],
            "in_data_loading": self.in_data,
            "steps_counted": self.steps_counted,
            "sync_debug_mode": None
            if not self.cuda_run
            else [{"site": list(s) if s else None, "per_step": {str(k): v for k, v in c.items()}} for s, c in self.debug_warnings.items()],
        }


def _to_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    for target in (args[0] if args else None, kwargs.get("device")):
        if isinstance(target, str) and target.split(":")[0] == "cpu":
            return True
        if isinstance(target, torch.device) and target.type == "cpu":
            return True
        if isinstance(target, torch.Tensor) and target.device.type == "cpu":
            return True
    return False


def _non_blocking(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """`.to(..., non_blocking=True)`: by keyword, or the one bool among the positional arguments
    (`to(device, dtype, non_blocking)`, `to(dtype, non_blocking)`, `to(other, non_blocking)`)."""
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return next((a for a in args if isinstance(a, bool)), False)


def _to_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """`.to(x)` names a device (not the literal string "cpu", not only a dtype)."""
    for target in (args[0] if args else None, kwargs.get("device")):
        if isinstance(target, str):
            return target.split(":")[0] != "cpu"
        if isinstance(target, (torch.device, torch.Tensor, int)) and not isinstance(target, bool):
            return True
    return False


def _has_mask_index(args: tuple[Any, ...]) -> bool:
    if len(args) < 2 or not isinstance(args[1], (list, tuple)):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])

"""Live tensor memory, where it was allocated, and the precision of matrix products.

How memory held between steps is measured on a CPU. torch's CPU allocator keeps no
statistics and process RSS includes the interpreter, the allocator's free lists and every
library, so neither says whether the loop holds more tensors over time. The options:
- `gc.get_objects()` at each step boundary, summing the storages of live tensors: it misses
  tensors only C++ holds (activations saved in an autograd graph that was never backward'd
  have no Python object) and walks every object each step: on the example (v7-fixed, CPU,
  one thread) 88 ms per step boundary against a 6 ms step (benchmarks/perf_overhead.py);
- a `TorchDispatchMode` that sees every operator's outputs: each new storage is registered
  once (keyed by its StorageImpl) with its size, the step it was created in and the target
  line that created it, and a weak reference on its Python storage object removes it when the
  storage is freed (storages keep one Python object for their whole life, so the callback
  fires when the memory is released, not before). The sum of live registered storages is the
  memory held, exact to the byte, graph-saved tensors included.
The second is used; it makes the instrumented run's steps about 5x slower than the timing
runs' on that example, which is why no time is taken from that run (on a loop of many
small operators the window planner in instrument.py pauses it after the steps the verdicts
need: `pause`). The per-operator path avoids Python-level hashing of operator packets and,
inside backward, walks the stack once per backward call. It does not see
storages made outside operators (`torch.from_numpy`, batches a worker process hands over
in shared memory); those are inputs, not what a loop accumulates. On CUDA the held memory is `torch.cuda.memory_allocated`, and the registry only
names where retained tensors come from.

The same mode counts matrix products (mm, addmm, bmm, convolution, attention) by input
dtype for the AMP check, and passes every operator to the sync counter.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.modules.module as module_hooks
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from .clock import StepClock
from .frame_index import FrameIndex, Site
from .syncs import WATCHED_PACKETS, SyncCounter
from ...harness.identity import ObjectMap
from ...harness.faults import call_original, guarded

aten = torch.ops.aten
_MATMULS = {
    aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.addbmm, aten._addmm_activation, aten.matmul,
    aten.linear, aten.convolution, aten._convolution, aten.mv, aten.addmv,
    aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_cudnn_attention,
}
_MATMUL_IDS = frozenset(id(p) for p in _MATMULS)
_WATCHED_IDS = _MATMUL_IDS | WATCHED_PACKETS
_REDUCED = {torch.float16, torch.bfloat16}
# The frame that runs the autograd engine: every operator of a C++ backward node is called
# from it, so one backward call's storages share one creation site.
_ENGINE_RUN = getattr(getattr(torch.autograd, "graph", None), "_engine_run_backward", None)
_ENGINE_CODE = getattr(_ENGINE_RUN, "__code__", None)
_ENGINE_SEARCH = 4  # frames between the dispatch mode and the engine's (torch's wrappers)


class Entry(weakref.ref[Any]):
    """One live storage: a weak reference to it (call the entry for the storage, None once
    freed) carrying what was recorded when it was made. One object per storage, with one
    shared release callback, instead of an entry, a reference and a closure: fewer objects
    per operator for the garbage collector to track on a loop of many small operators."""

    __slots__ = ("key", "nbytes", "site", "step", "tensor", "device", "bound")
    key: int  # the storage's identity in the registry
    nbytes: int
    site: Site | None
    step: int  # interval it was created in; -1 before training
    tensor: Any  # weakref to the first tensor seen with it, or None
    device: str
    bound: bool  # on a CPU run: holds model state or what was computed from it

    def __new__(cls, storage: Any, callback: Any, *fields: Any) -> Entry:
        return super().__new__(cls, storage, callback)

    def __init__(self, storage: Any, callback: Any, key: int, nbytes: int, site: Site | None, step: int, tensor: Any, device: str, bound: bool = False) -> None:
        # weakref.ref.__new__ made the reference; its __init__ only re-reads the arguments.
        self.key, self.nbytes, self.site, self.step, self.tensor, self.device, self.bound = key, nbytes, site, step, tensor, device, bound


@dataclass
class AutocastUse:
    site: Site | None
    device: str
    dtype: str
    enabled: bool
    entries: int = 0
    matmuls: dict[str, int] = field(default_factory=dict)


class _Mode(TorchDispatchMode):
    def __init__(self, tracker: Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = call_original(func, *args, **kwargs)
        tracker = self.tracker
        # The main thread, or the autograd engine's device threads while the main thread waits
        # in backward. A process forked from this one (a DataLoader worker) has `active` off.
        if tracker.active and (threading.get_ident() == tracker.clock.main_thread or tracker.clock._in_backward):
            tracker.on_op(func, args, kwargs, out)
        return out


# Outputs that CUDA kernels leave on the host, by position, whatever their inputs: a packed
# sequence's `batch_sizes` (its lengths, which `pack_padded_sequence` requires on the CPU and
# every recurrent layer then reads) lives on the CPU, so reading it synchronises nothing.
_HOST_OUTPUTS: dict[int, tuple[int, ...]] = {id(torch.ops.aten._pack_padded_sequence): (1,)}


class Tracker:
    """Registry of live storages plus the per-operator observations."""

    def __init__(self, frames: FrameIndex, clock: StepClock, syncs: SyncCounter) -> None:
        self.frames = frames
        self.clock = clock
        self.syncs = syncs
        self.pid = os.getpid()
        self.registry: dict[int, Entry] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.registered = 0
        self.matmuls_in_steps: dict[str, int] = {}
        self.matmuls_outside: dict[str, int] = {}
        self.autocast: dict[tuple[Any, ...], AutocastUse] = {}
        self._autocast_stack: list[AutocastUse | None] = []
        self._mode: _Mode | None = None
        # On a CPU every tensor lives on the host; what would live on the device in a CUDA
        # run is followed instead: model parameters and buffers, anything moved with
        # `.to(device)`, and every operator output with such an input.
        self.follow_device = not torch.cuda.is_available()
        # By identity, not id(): a module made after another was freed often gets its id, and
        # would go unmarked. Weak only: this run measures memory, so it keeps nothing alive.
        self._seen_modules: ObjectMap[bool] = ObjectMap(keep_alive=False)
        # Operators observed so far (the window planner reads it per step) and whether they
        # are still observed: `pause` ends the per-operator work once its window is covered.
        self.ops = 0
        self.active = True
        self._engine_key: tuple[int, int] | None = None  # (backward call, engine frame id)
        self._engine_site: Site | None = None
        self._release = self._released  # one bound method for every storage's weak reference
        # Checked once at fork instead of `os.getpid()` per operator.
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        if os.getpid() != self.pid:
            self.active = False

    def install(self) -> None:
        self._wrap_autocast()
        if self.follow_device:
            module_hooks.register_module_forward_pre_hook(guarded(self._mark_module))
        self._mode = _Mode(self)
        self._mode.__enter__()

    def pause(self) -> None:
        """Stop the per-operator work for the rest of the run. The mode leaves the dispatch
        stack when it is on top of it (no cost at all from then on); under a mode the target
        entered later it stays as a pass-through, since popping it would pop the target's.
        Storages already registered keep their release callbacks, so what the window made
        and the loop still holds stays visible."""
        self.active = False
        if self._mode is not None and _get_current_dispatch_mode() is self._mode:
            self.uninstall()

    def uninstall(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None

    # -- per operator -------------------------------------------------------------------
    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self.ops += 1
        packet = id(func.overloadpacket)
        if packet in _WATCHED_IDS:
            self.syncs.on_dispatch(func, args, kwargs)
            if packet in _MATMUL_IDS:
                self._count_matmul(args)
        bound = self.follow_device and self._any_bound(args, kwargs)
        if isinstance(out, torch.Tensor):
            self._register(out, bound)
        elif isinstance(out, (tuple, list)):
            host = _HOST_OUTPUTS.get(packet, ()) if bound else ()
            for index, item in enumerate(out):
                if isinstance(item, torch.Tensor):
                    self._register(item, bound and index not in host)

    # -- what would live on the device (CPU runs) ---------------------------------------
    def bound(self, tensor: Any) -> bool:
        entry = self._entry(tensor)
        return entry is not None and entry.bound

    def mark_bound(self, tensor: Any) -> None:
        entry = self._entry(tensor)
        if entry is not None:
            entry.bound = True

    def _entry(self, tensor: Any) -> Entry | None:
        try:
            return self.registry.get(tensor.untyped_storage()._cdata)
        except Exception:  # noqa: BLE001 - no plain storage
            return None

    def _any_bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        # Inlined registry lookups: this runs for every operator of a CPU run.
        registry = self.registry
        for value in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(value, torch.Tensor):
                try:
                    entry = registry.get(value.untyped_storage()._cdata)
                except Exception:  # noqa: BLE001 - no plain storage
                    continue
                if entry is not None and entry.bound:
                    return True
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, torch.Tensor) and self.bound(item):
                        return True
        return False

    def _mark_module(self, module: Any, args: Any) -> None:
        if module in self._seen_modules or not self.clock.mine():
            return
        self._seen_modules[module] = True
        for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            self.mark_bound(tensor)

    def _count_matmul(self, args: tuple[Any, ...]) -> None:
        dtype = next((str(a.dtype).removeprefix("torch.") for a in args[:3] if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
        if dtype is None:
            return
        target = self.matmuls_in_steps if self.clock.started and not self.clock.in_data() else self.matmuls_outside
        target[dtype] = target.get(dtype, 0) + 1
        use = self._autocast_stack[-1] if self._autocast_stack else None
        if use is not None:
            use.matmuls[dtype] = use.matmuls.get(dtype, 0) + 1

    def _register(self, tensor: torch.Tensor, bound: bool = False) -> None:
        try:
            storage = tensor.untyped_storage()
            key = storage._cdata
        except Exception:  # noqa: BLE001 - sparse, meta or subclass tensors have no plain storage
            return
        known = self.registry.get(key)
        if known is not None:
            if bound:
                known.bound = True
            return
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        site = self._creation_site(sys._getframe(3))  # one tuple per call instruction (`FrameIndex.site`)
        try:
            tensor_ref = weakref.ref(tensor)
        except TypeError:
            tensor_ref = None
        step = self.clock.completed if self.clock.started else -1
        try:
            self.registry[key] = Entry(storage, self._release, key, nbytes, site, step, tensor_ref, storage.device.type, bound)
        except TypeError:
            return
        self.registered += 1
        self.live_bytes += nbytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    def _released(self, freed: Entry) -> None:
        if self.registry.get(freed.key) is freed:
            del self.registry[freed.key]
            self.live_bytes -= freed.nbytes

    def _creation_site(self, frame: Any) -> Site | None:
        """The innermost target frame above the operator's caller `frame`. Inside backward,
        operators called by the autograd engine itself share the engine frame's answer,
        found once per backward call instead of by a walk up the stack per operator."""
        clock = self.clock
        if clock._in_backward:
            probe = frame
            for _ in range(_ENGINE_SEARCH):
                if probe is None:
                    break
                if probe.f_code is _ENGINE_CODE:
                    key = (clock.backward_calls, id(probe))
                    if key != self._engine_key:
                        self._engine_key, self._engine_site = key, self.frames.innermost(probe)
                    return self._engine_site or clock.backward_site
                probe = probe.f_back
            return self.frames.innermost(frame) or clock.backward_site
        return self.frames.innermost(frame)

    def site_of(self, tensor: Any) -> Site | None:
        """Where the storage under `tensor` was created, if it was registered."""
        try:
            entry = self.registry.get(tensor.untyped_storage()._cdata)
        except Exception:  # noqa: BLE001
            return None
        return entry.site if entry is not None else None

    # -- at step boundaries -------------------------------------------------------------
    def held_bytes(self, device: str) -> int:
        """Bytes of live tensor storage on `device`'s type, sizes re-read (resize_ grows them)."""
        if device.startswith("cuda"):
            return int(torch.cuda.memory_allocated(torch.device(device)))
        total = 0
        for entry in list(self.registry.values()):
            storage = entry()
            if storage is None:
                continue
            try:
                size = storage.nbytes()
            except RuntimeError:
                continue
            if size != entry.nbytes:
                self.live_bytes += size - entry.nbytes
                entry.nbytes = size
            if entry.device == "cpu":
                total += size
        return total

    def survivors(self, first_step: int, last_step: int, device_type: str) -> dict[Site | None, list[Entry]]:
        """Live storages created in steps [first_step, last_step], grouped by creation site."""
        groups: dict[Site | None, list[Entry]] = {}
        for entry in list(self.registry.values()):
            if first_step <= entry.step <= last_step and entry.device == device_type:
                groups.setdefault(entry.site, []).append(entry)
        return groups

    # -- autocast -----------------------------------------------------------------------
    def _wrap_autocast(self) -> None:
        tracker = self
        cls = torch.amp.autocast_mode.autocast
        enter, leave = cls.__enter__, cls.__exit__

        def __enter__(self: Any) -> Any:
            result = enter(self)
            if tracker.clock.mine():
                site = tracker.frames.innermost(sys._getframe(1))
                dtype = str(getattr(self, "fast_dtype", "")).removeprefix("torch.")
                key = (site, str(getattr(self, "device", "")), dtype, bool(getattr(self, "_enabled", True)))
                use = tracker.autocast.get(key)
                if use is None:
                    use = tracker.autocast[key] = AutocastUse(site, key[1], dtype, key[3])
                use.entries += 1
                tracker._autocast_stack.append(use)
            return result

        def __exit__(self: Any, *exc: Any) -> Any:
            if tracker.clock.mine() and tracker._autocast_stack:
                tracker._autocast_stack.pop()
            return leave(self, *exc)

        cls.__enter__ = __enter__  # type: ignore[method-assign]
        cls.__exit__ = __exit__  # type: ignore[method-assign]

    def amp_record(self) -> dict[str, Any]:
        return {
            "matmul_dtypes_in_steps": self.matmuls_in_steps,
            "matmul_dtypes_outside_steps": self.matmuls_outside,
            "reduced_in_steps": sum(n for d, n in self.matmuls_in_steps.items() if getattr(torch, d, None) in _REDUCED),
            "autocast": [
                {"site": list(u.site) if u.site else None, "device": u.device, "dtype": u.dtype, "enabled": u.enabled, "entries": u.entries, "matmuls": u.matmuls}
                for u in self.autocast.values()
            ],
        }

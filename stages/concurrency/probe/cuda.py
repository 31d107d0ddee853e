"""CUDA-only instruments: non_blocking device-to-host copies read too early, and stream races.

`NonBlockingWatch` is a TorchDispatchMode. A device-to-host copy made with non_blocking=True
(`aten._to_copy` to cpu from a CUDA tensor, whose result PyTorch pins; or `aten.copy_` into a
pinned CPU tensor) returns before the bytes arrive. Its result is pending until the host
synchronises (device, stream or event synchronize, seen through torch's GPU trace callbacks,
or a blocking copy / `.item()` on a CUDA tensor, which waits for the stream). Any op that reads
the pending tensor, `.item()`, `.tolist()` or `.numpy()` before that is a race.

`StreamSanitizer` runs PyTorch's CUDA sanitizer (CSAN) and records each unsynchronised access
it reports, with the target's frame, instead of letting it abort the run: the training goes
on, so the other checks of the same run still observe it.

Both are dispatch modes, and a DataLoader worker started with `fork` inherits them. Nothing a
worker runs touches the GPU, but CSAN asks for the current CUDA stream on every operator,
which CUDA refuses in a forked child ("Cannot re-initialize CUDA in forked subprocess"): in a
forked child both modes pass every operator straight through (`passing_through_in_forked_children`).
"""

from __future__ import annotations

import functools
import os
import threading
import traceback
from typing import Any
from collections.abc import Callable

from ...harness.sites import SiteTable
from ...harness.identity import reference
from ...harness.faults import call_original

MAX_RECORDS = 50


class _ForkState:
    """Whether this process is a fork of the one the watches were installed in. Registered at
    the first install, in the run's own process: a process forked before that (the run itself,
    from a host that imported this module) is not a forked child."""

    forked = False
    registered = False

    @classmethod
    def mark(cls) -> None:
        cls.forked = True

    @classmethod
    def register(cls) -> None:
        if not cls.registered:
            os.register_at_fork(after_in_child=cls.mark)
            cls.registered = True


def passing_through_in_forked_children(mode_class: Any) -> None:
    """Make `mode_class`'s dispatch a plain call of the operator in a forked child (once)."""
    _ForkState.register()
    original = mode_class.__torch_dispatch__
    if getattr(original, "passes_through_in_forked_children", False):
        return

    @functools.wraps(original)
    def dispatch(mode: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if _ForkState.forked:
            return call_original(func, *args, **(kwargs or {}))
        return call_original(original, mode, func, types, args, kwargs)

    dispatch.passes_through_in_forked_children = True  # type: ignore[attr-defined]
    mode_class.__torch_dispatch__ = dispatch


class NonBlockingWatch:
    def __init__(self) -> None:
        self.available = False
        self.sites: SiteTable | None = None
        # storage pointer -> (weak reference to the storage, the copy): a destination freed unread
        # leaves its pointer to the next storage allocated there, which this copy never wrote
        self.pending: dict[int, tuple[Callable[[], Any], dict[str, Any]]] = {}
        self.races: list[dict[str, Any]] = []
        self.copies = 0
        self._lock = threading.Lock()
        self._reported: set[Any] = set()

    def install(self, ctx: Any) -> None:
        import torch

        if not torch.cuda.is_available():
            return
        self.available = True
        self.sites = SiteTable(ctx.root)
        self._register_sync_callbacks(torch)
        self._wrap_host_reads(torch)
        mode_class = _mode_class(torch)
        passing_through_in_forked_children(mode_class)
        mode_class(self).__enter__()

    def _register_sync_callbacks(self, torch: Any) -> None:
        from torch.cuda import _gpu_trace

        torch._C._activate_gpu_trace()
        _gpu_trace.register_callback_for_device_synchronization(self.synchronized)
        _gpu_trace.register_callback_for_stream_synchronization(lambda _stream: self.synchronized())
        _gpu_trace.register_callback_for_event_synchronization(lambda _event: self.synchronized())

    def _wrap_host_reads(self, torch: Any) -> None:
        for name in ("tolist", "numpy", "__array__"):
            original = getattr(torch.Tensor, name)

            def read(tensor: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                self.check_read(tensor, f".{_name}()")
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, functools.wraps(original)(read))

    def synchronized(self) -> None:
        with self._lock:
            self.pending.clear()

    @staticmethod
    def storage(tensor: Any) -> Any:
        """The tensor's storage: one Python object for the storage's whole life, shared by its views."""
        try:
            storage = tensor.untyped_storage()
            storage.data_ptr()
            return storage
        except Exception:  # noqa: BLE001 - tensors without storage (meta, sparse) never race
            return None

    def copied(self, result: Any) -> None:
        assert self.sites is not None
        storage = self.storage(result)
        if storage is None:
            return
        self.copies += 1
        with self._lock:
            self.pending[int(storage.data_ptr())] = (reference(storage), {"copy_site": self.sites.site(self.sites.innermost())})

    def check_read(self, tensor: Any, how: str) -> None:
        if _ForkState.forked or not self.pending or getattr(tensor, "device", None) is None or tensor.device.type != "cpu":
            return
        storage = self.storage(tensor)
        with self._lock:
            entry = self.pending.pop(int(storage.data_ptr()), None) if storage is not None else None
        if entry is None or entry[0]() is not storage:
            return  # no copy pending, or only one into a freed storage at the same address
        copy = entry[1]
        assert self.sites is not None
        read_site = self.sites.site(self.sites.innermost())
        if read_site is None:
            return  # read by the gate or torch after the entrypoint returned
        marker = ((copy["copy_site"] or {}).get("path"), (copy["copy_site"] or {}).get("line"), read_site["line"])
        if marker in self._reported or len(self.races) >= MAX_RECORDS:
            return
        self._reported.add(marker)
        self.races.append({**copy, "read_site": read_site, "read_by": how})

    def collect(self) -> dict[str, Any]:
        from .payloads import NonBlockingPayload  # at collect(): no start-up cost

        return NonBlockingPayload.sent({"available": self.available, "copies": self.copies, "races": self.races})


def _mode_class(torch: Any) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    aten = torch.ops.aten
    blocking_sync_ops = {aten._local_scalar_dense.default}

    class _NonBlockingMode(TorchDispatchMode):
        def __init__(self, watch: NonBlockingWatch) -> None:
            super().__init__()
            self.watch = watch

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if self.watch.pending:
                written = args[0] if func is aten.copy_.default else None
                for t in inputs:
                    if t is not written:
                        self.watch.check_read(t, str(func.overloadpacket.__name__))
            out = call_original(func, *args, **kwargs)
            self._after(func, args, kwargs, inputs, out)
            return out

        def _after(self, func: Any, args: Any, kwargs: Any, inputs: list[Any], out: Any) -> None:
            if func in blocking_sync_ops and inputs and inputs[0].is_cuda:
                self.watch.synchronized()
            elif func is aten._to_copy.default and isinstance(out, torch.Tensor) and args and args[0].is_cuda and out.device.type == "cpu":
                if kwargs.get("non_blocking"):
                    self.watch.copied(out)
                else:
                    self.watch.synchronized()
            elif func is aten.copy_.default and len(args) > 1 and args[1].is_cuda and args[0].device.type == "cpu":
                non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking"))
                if non_blocking and args[0].is_pinned():
                    self.watch.copied(args[0])
                else:
                    self.watch.synchronized()

    return _NonBlockingMode


class StreamSanitizer:
    def __init__(self) -> None:
        self.available = False
        self.sites: SiteTable | None = None
        self.reports: list[dict[str, Any]] = []
        self.total = 0

    def install(self, ctx: Any) -> None:
        import torch

        if not torch.cuda.is_available():
            return
        from torch.cuda import _sanitizer

        self.available = True
        self.sites = SiteTable(ctx.root)
        handle = _sanitizer.EventHandler._handle_kernel_launch
        sanitizer = self

        @functools.wraps(handle)
        def handle_kernel_launch(handler: Any, *args: Any, **kwargs: Any) -> list[Any]:
            errors = handle(handler, *args, **kwargs)
            for error in errors:
                sanitizer.record(error)
            return []  # recorded; the run goes on so its other checks still observe it

        _sanitizer.EventHandler._handle_kernel_launch = handle_kernel_launch  # type: ignore[method-assign,assignment]
        passing_through_in_forked_children(_sanitizer.CUDASanitizerDispatchMode)
        _sanitizer.enable_cuda_sanitizer()

    def _target_frame(self, stack: Any) -> dict[str, Any] | None:
        """Innermost target frame of a CSAN stack (outermost first)."""
        assert self.sites is not None
        for frame in reversed(list(stack or [])):
            if self.sites.is_target(frame.filename):
                return self.sites.site(self.sites.intern(frame.filename, frame.lineno or 0, frame.name))
        return None

    def record(self, error: Any) -> None:
        self.total += 1
        if len(self.reports) >= MAX_RECORDS:
            return
        current = getattr(error, "current_access", None)
        previous = getattr(error, "previous_access", None)
        try:
            text = str(error)
        except Exception:  # noqa: BLE001
            text = "".join(traceback.format_exception_only(type(error), error))
        self.reports.append(
            {
                "message": text[-6000:],
                "site": self._target_frame(getattr(current, "stack_trace", None)),
                "previous_site": self._target_frame(getattr(previous, "stack_trace", None)),
                "operator": str(getattr(current, "operator", ""))[:300],
                "previous_operator": str(getattr(previous, "operator", ""))[:300],
                "streams": [getattr(current, "stream", None), getattr(previous, "stream", None)],
            }
        )

    def collect(self) -> dict[str, Any]:
        from .payloads import StreamPayload  # at collect(): no start-up cost

        return StreamPayload.sent({"available": self.available, "reports": self.reports, "total": self.total})

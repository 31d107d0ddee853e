"""Training steps found from PyTorch itself, with where each step's time goes.

No cooperation from the target: a step ends at the global optimizer step post-hook
(`register_optimizer_step_post_hook`), its loss is the tensor `backward` is called on (the
unscaled one when it went through `GradScaler.scale`), its forward starts at the outermost
module call seen by the global forward pre-hook, and its data wait is the time spent in
`DataLoader.__iter__` and the loader iterator's `__next__`. Phases nest (Lightning runs
forward and backward inside `optimizer.step(closure)`), so time is charged to the innermost
phase only. Every transition is timestamped on the host and, when the loop runs on CUDA,
also by a CUDA event, so step times measure the device's timeline without a sync per step.

Only the main thread of the main process is followed: DataLoader workers forked from it
inherit these hooks but their calls are not the training step.
"""

from __future__ import annotations

import operator
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import torch
import torch.nn.modules.module as module_hooks
import torch.utils.data.dataloader as dataloader_module
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ...common.frames import relative
from ...harness.tensors import exact_dtype
from .frame_index import FrameIndex, Site, caller_frame, graph_size
from .graph_span import sequence_number
from ...harness.faults import guarded

PHASES = ("data", "forward", "backward", "optimizer")
INSTRUMENT = "instrument"  # time the instruments spend at step boundaries: not the target's
MAX_STEPS = 5000


@dataclass
class LoaderInfo:
    """A DataLoader the target created: where, and with which settings."""

    site: Site | None
    settings: dict[str, Any]
    dataset: str
    getitem: Site | None
    wait_s: float = 0.0
    batches: int = 0
    fed_steps: int = 0  # steps whose last batch came from this loader
    step_waits: dict[int, float] = field(default_factory=dict)  # step interval -> seconds waited


@dataclass
class Transition:
    host: float
    event: Any  # torch.cuda.Event on CUDA, else None
    phase: str  # the phase active from now on ("" = the rest of the step)


@dataclass
class StepClock:
    """Step boundaries and phase timeline of the main thread."""

    frames: FrameIndex
    read_loss: Callable[[torch.Tensor], float] | None = None  # eager loss reading; None = keep tensors
    pid: int = field(default_factory=os.getpid)
    main_thread: int = field(default_factory=threading.get_ident)
    stack: list[str] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    boundaries: list[int] = field(default_factory=list)  # index of the transition ending each step
    losses: list[Any] = field(default_factory=list)
    listeners: list[Callable[[int], None]] = field(default_factory=list)
    loaders: dict[int, LoaderInfo] = field(default_factory=dict)
    forward_sites: dict[Site, int] = field(default_factory=dict)
    backward_site: Site | None = None
    cuda: bool = False
    training_device: str = "cpu"
    measure_graph: bool = False  # size of one step's autograd graph (the leak search needs it)
    step_graph_nodes: int = 0
    # With measure_graph: per completed step, the sequence number of the newest autograd
    # node its backward calls started from. Nodes are numbered in creation order, so these
    # marks tell which step made a node (probe/graph_span.py).
    seq_marks: list[int] = field(default_factory=list)
    _newest_seq: int = -1
    backward_calls: int = 0
    training_forwards: int = 0
    _pending_losses: list[Any] = field(default_factory=list)
    _activity: bool = False
    _fwd_depth: int = 0
    _fwd_counted: bool = False
    _in_backward: int = 0
    _scaled: tuple[Any, Any] | None = None
    _iterators: weakref.WeakKeyDictionary[Any, int] = field(default_factory=weakref.WeakKeyDictionary)
    _loader_keys: weakref.WeakKeyDictionary[Any, int] = field(default_factory=weakref.WeakKeyDictionary)
    _last_loader: int | None = None

    # -- state read by the other instruments -------------------------------------------
    @property
    def completed(self) -> int:
        return len(self.boundaries)

    @property
    def started(self) -> bool:
        return bool(self.transitions)

    def phase(self) -> str:
        if not self.transitions:
            return "before"
        return self.stack[-1] if self.stack else ""

    def in_data(self) -> bool:
        return "data" in self.stack

    def mine(self) -> bool:
        return threading.get_ident() == self.main_thread and os.getpid() == self.pid

    # -- timeline -----------------------------------------------------------------------
    def _mark(self) -> None:
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.transitions.append(Transition(time.perf_counter(), event, self.stack[-1] if self.stack else ""))

    def push(self, phase: str) -> None:
        if self.completed >= MAX_STEPS:
            return
        self.stack.append(phase)
        self._mark()

    def pop(self, phase: str) -> None:
        if phase not in self.stack:
            return
        # Remove the innermost occurrence: a phase left by an exception may sit above it.
        index = len(self.stack) - 1 - self.stack[::-1].index(phase)
        del self.stack[index:]
        if self.transitions:
            self._mark()

    # -- hooks --------------------------------------------------------------------------
    def install(self) -> None:
        self.cuda = torch.cuda.is_available()
        module_hooks.register_module_forward_pre_hook(guarded(self._forward_pre))
        module_hooks.register_module_forward_hook(guarded(self._forward_post), always_call=True)
        register_optimizer_step_pre_hook(guarded(self._step_pre))
        register_optimizer_step_post_hook(guarded(self._step_post))
        self._wrap_backward()
        self._wrap_grad_scaler()
        self._wrap_dataloader()

    def _forward_pre(self, module: Any, args: Any) -> None:
        if not self.mine():
            return
        self._fwd_depth += 1
        if self._fwd_depth == 1 and torch.is_grad_enabled():
            self._fwd_counted = True
            self.training_forwards += 1
            self._activity = True
            self.push("forward")
            site = self.frames.innermost(caller_frame(2))
            if site is not None:
                self.forward_sites[site] = self.forward_sites.get(site, 0) + 1

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if not self.mine() or self._fwd_depth == 0:
            return
        self._fwd_depth -= 1
        if self._fwd_depth == 0 and self._fwd_counted:
            self._fwd_counted = False
            self.pop("forward")

    def _step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.mine():
            self.push("optimizer")

    def _step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.mine():
            return
        self.pop("optimizer")
        if not self._activity or not self.transitions or self.completed >= MAX_STEPS:
            return  # a second optimizer stepping on the same backward: the same step
        self._activity = False
        if not self.boundaries:
            self.training_device = _device_of(optimizer)
        if self._last_loader is not None and self._last_loader in self.loaders:
            self.loaders[self._last_loader].fed_steps += 1
        self._last_loader = None
        self.boundaries.append(len(self.transitions) - 1)
        if self.measure_graph:
            self.seq_marks.append(self._newest_seq)
        self.losses.append(_mean_loss(self._pending_losses))
        self._pending_losses = []
        if self.listeners:
            self.push(INSTRUMENT)
            for listener in self.listeners:
                listener(self.completed)
            self.pop(INSTRUMENT)

    def _record_loss(self, tensor: Any) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.numel() != 1:
            return
        if self._scaled is not None and self._scaled[0]() is tensor:
            tensor = self._scaled[1]
        self._scaled = None
        loss = tensor.detach()
        self._pending_losses.append(self.read_loss(loss) if self.read_loss else loss)

    def _wrap_backward(self) -> None:
        clock = self
        tensor_backward = torch.Tensor.backward
        autograd_backward = torch.autograd.backward

        def run_backward(call: Callable[[], Any], loss: Any) -> Any:
            mine = clock.mine() and clock._in_backward == 0
            if not mine:
                return call()
            clock._in_backward += 1
            clock.backward_calls += 1
            clock._activity = True
            clock.backward_site = clock.frames.innermost(caller_frame(3))
            if clock.measure_graph and isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
                clock._newest_seq = max(clock._newest_seq, sequence_number(loss.grad_fn))
                if clock.completed in (1, 2):
                    clock.step_graph_nodes = max(clock.step_graph_nodes, graph_size(loss))
            clock.push("backward")
            try:
                return call()
            finally:
                clock.pop("backward")
                clock._in_backward -= 1
                clock._record_loss(loss)

        def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return run_backward(lambda: tensor_backward(self, *args, **kwargs), self)

        def autograd_backward_wrapper(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            loss = tensors if isinstance(tensors, torch.Tensor) else (tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else None)
            return run_backward(lambda: autograd_backward(tensors, *args, **kwargs), loss)

        torch.Tensor.backward = backward  # type: ignore[method-assign]
        torch.autograd.backward = autograd_backward_wrapper

    def _wrap_grad_scaler(self) -> None:
        clock = self
        scale = torch.amp.GradScaler.scale

        def scale_wrapper(self: Any, outputs: Any) -> Any:
            result = scale(self, outputs)
            if isinstance(outputs, torch.Tensor) and isinstance(result, torch.Tensor) and clock.mine():
                clock._scaled = (weakref.ref(result), outputs)
            return result

        torch.amp.GradScaler.scale = scale_wrapper  # type: ignore[method-assign]

    def _wrap_dataloader(self) -> None:
        clock = self
        loader_cls = dataloader_module.DataLoader
        init, iterate = loader_cls.__init__, loader_cls.__iter__
        next_batch = dataloader_module._BaseDataLoaderIter.__next__

        def init_wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if clock.mine():
                key = len(clock.loaders)
                clock.loaders[key] = _loader_info(self, clock.frames)
                try:
                    clock._loader_keys[self] = key
                except TypeError:
                    pass

        def iter_wrapper(self: Any) -> Any:
            if not clock.mine():
                return iterate(self)
            clock.push("data")
            try:
                iterator = iterate(self)
            finally:
                clock.pop("data")
            key = clock._loader_keys.get(self)
            if key is not None:
                try:
                    clock._iterators[iterator] = key
                except TypeError:
                    pass
            return iterator

        def next_wrapper(self: Any) -> Any:
            if not clock.mine():
                return next_batch(self)
            started = time.perf_counter()
            clock.push("data")
            try:
                return next_batch(self)
            finally:
                clock.pop("data")
                key = clock._iterators.get(self, -1)
                info = clock.loaders.get(key)
                if info is not None:
                    waited = time.perf_counter() - started
                    info.wait_s += waited
                    info.batches += 1
                    step = clock.completed
                    info.step_waits[step] = info.step_waits.get(step, 0.0) + waited
                    clock._last_loader = key

        loader_cls.__init__ = init_wrapper  # type: ignore[method-assign]
        loader_cls.__iter__ = iter_wrapper  # type: ignore[method-assign]
        dataloader_module._BaseDataLoaderIter.__next__ = next_wrapper  # type: ignore[method-assign]

    # -- results ------------------------------------------------------------------------
    def collect(self) -> dict[str, Any]:
        """Per-step times by phase (host clock, and device clock on CUDA) and losses."""
        if self.cuda and any(t.event is not None for t in self.transitions):
            torch.cuda.synchronize()
        host = self._per_step(lambda a, b: b.host - a.host)
        device = self._per_step(lambda a, b: a.event.elapsed_time(b.event) / 1000.0) if self._events_usable() else None
        peak = None
        if self.training_device.startswith("cuda"):
            peak = int(torch.cuda.max_memory_allocated(torch.device(self.training_device)))
        return {
            "steps": self.completed,
            "backward_calls": self.backward_calls,
            "training_forwards": self.training_forwards,
            "training_device": self.training_device,
            "host": host,
            "device": device,
            "losses": [_as_float(v) for v in self.losses],
            "loaders": [_loader_record(info) for info in self.loaders.values()],
            "forward_sites": [[list(s), n] for s, n in sorted(self.forward_sites.items(), key=lambda item: -item[1])[:5]],
            "peak_memory_bytes": peak,
            "truncated": self.completed >= MAX_STEPS,
        }

    def _events_usable(self) -> bool:
        return self.cuda and self.training_device.startswith("cuda") and all(t.event is not None for t in self.transitions)

    def _per_step(self, duration: Callable[[Transition, Transition], float]) -> dict[str, list[float]]:
        """For each step: total time (instrument time excluded) and time per phase."""
        out: dict[str, list[float]] = {"step": [], **{p: [] for p in PHASES}, "rest": []}
        start = 0
        for end in self.boundaries:
            per = {p: 0.0 for p in (*PHASES, "rest")}
            for a, b in zip(self.transitions[start:end], self.transitions[start + 1 : end + 1], strict=False):
                if a.phase == INSTRUMENT:
                    continue
                per[a.phase or "rest"] = per.get(a.phase or "rest", 0.0) + duration(a, b)
            for p in per:
                if p in out:
                    out[p].append(round(per[p], 7))
            out["step"].append(round(sum(v for k, v in per.items() if k in out), 7))
            start = end
        return out


def _device_of(optimizer: Any) -> str:
    for group in getattr(optimizer, "param_groups", []):
        for param in group.get("params", []):
            if isinstance(param, torch.Tensor):
                return str(param.device)
    return "cpu"


def _mean_loss(values: list[Any]) -> Any:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    if all(isinstance(v, float) for v in values):
        return sum(values) / len(values)
    # Each loss in its own precision (float64 stays float64: through float32 it could overflow to inf).
    return torch.stack([v.detach().real.to(exact_dtype(torch, v)) if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64) for v in values]).mean()


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.item()) if isinstance(value, torch.Tensor) else float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def _loader_info(loader: Any, frames: FrameIndex) -> LoaderInfo:
    dataset = getattr(loader, "dataset", None)
    getitem = None
    method = getattr(type(dataset), "__getitem__", None)
    code = getattr(method, "__code__", None)
    if code is not None and frames.is_target(code):
        getitem = (relative(code.co_filename, frames.root), code.co_firstlineno, code.co_name)
    settings = {
        "batch_size": _count(getattr(loader, "batch_size", None)),
        "num_workers": _count(getattr(loader, "num_workers", None)),
        "pin_memory": _flag(getattr(loader, "pin_memory", None)),
        "prefetch_factor": _count(getattr(loader, "prefetch_factor", None)),
        "persistent_workers": _flag(getattr(loader, "persistent_workers", None)),
    }
    return LoaderInfo(
        site=frames.innermost(caller_frame(3)),
        settings=settings,
        dataset=f"{type(dataset).__module__}.{type(dataset).__qualname__}",
        getitem=getitem,
    )


def _count(value: Any) -> int | None:
    """A DataLoader count setting as a plain int. The target may pass a numpy integer, which
    the result's JSON would carry as its repr; None when it is not a whole number."""
    if value is None:
        return None
    try:
        return operator.index(value)
    except Exception:  # noqa: BLE001 - not an integer (a float, a target object): never fail the target's DataLoader()
        return int(value) if isinstance(value, float) and value.is_integer() else None


def _flag(value: Any) -> bool | None:
    """A DataLoader switch as the DataLoader reads it: by its truth value."""
    if value is None:
        return None
    try:
        return bool(value)
    except Exception:  # noqa: BLE001 - a target object whose truth value raises
        return None


def _loader_record(info: LoaderInfo) -> dict[str, Any]:
    return {
        "site": list(info.site) if info.site else None,
        "settings": info.settings,
        "dataset": info.dataset,
        "getitem": list(info.getitem) if info.getitem else None,
        "wait_s": round(info.wait_s, 6),
        "batches": info.batches,
        "fed_steps": info.fed_steps,
        "step_waits": {str(k): round(v, 7) for k, v in info.step_waits.items()},
    }

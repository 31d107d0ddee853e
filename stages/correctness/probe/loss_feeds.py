"""Whether the outputs of a forward under no_grad feed the loss of the same step (train-eval-mode).

A target, teacher or EMA network (BYOL, MoCo, DINO, mean teacher) runs under `no_grad` in
train mode on purpose: its outputs are the targets of the step's loss, so that forward is
training, not evaluation. An evaluation pass's outputs reach no backward.

When a model runs such a forward (`watch`), a forward hook on it marks its outputs, and a
`TorchFunctionMode` carries the mark to every tensor an operation makes from a marked one
until the next backward call, optimizer step, or `MAX_OPS` operations: a backward on a marked
loss says the outputs fed it. Each (line, model) is judged once, at its first such forward;
the mode is active only from that forward to the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Hashable
from ...harness.faults import call_original, guarded

MAX_OPS = 20_000  # operations followed in one window; past it, the outputs fed nothing seen


@dataclass
class _Window:
    keys: list[Hashable] = field(default_factory=list)
    marked: dict[int, Any] = field(default_factory=dict)  # id -> tensor, held so no id passes to another
    ops: int = 0
    overflowed: bool = False  # past MAX_OPS: judged as feeding nothing at the window's end


class LossFeeds:
    def __init__(self, torch: Any, judged: Callable[[Hashable, bool], None]) -> None:
        """`judged(key, feeds)` is called once per key with the verdict."""
        self.torch = torch
        self._judged = judged
        self._window: _Window | None = None
        self._mode: Any = None
        self._broken = False  # the target left another mode above ours: no more windows
        self._hooked: set[int] = set()  # models whose forward hook waits for their output

    # -- the window ------------------------------------------------------------------------------
    def watch(self, model: Any, key: Hashable) -> bool:
        """Follow `model`'s output from the forward now running; False: it cannot be followed."""
        if self._broken or model is None:
            return False
        window = self._open()
        if key not in window.keys:
            window.keys.append(key)
        if id(model) not in self._hooked:
            self._hooked.add(id(model))
            handle: list[Any] = []

            def returned(module: Any, args: Any, output: Any) -> None:
                handle[0].remove()
                self._hooked.discard(id(module))
                if self._window is window:
                    self._mark(output)

            handle.append(model.register_forward_hook(guarded(returned)))
        return True

    def backward(self, tensors: Any) -> None:
        window = self._window
        if window is not None:
            self._close(feeds=not window.overflowed and any(id(t) in window.marked for t in _tensors(self.torch, tensors)))

    def stepped(self) -> None:
        if self._window is not None:
            self._close(feeds=False)

    def _open(self) -> _Window:
        if self._window is None:
            from torch.overrides import TorchFunctionMode

            feeds = self

            class _Follow(TorchFunctionMode):
                def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                    out = call_original(func, *args, **(kwargs or {}))
                    feeds._followed(args, kwargs, out)
                    return out

            self._window = _Window()
            self._mode = _Follow()
            self._mode.__enter__()
        return self._window

    def _close(self, *, feeds: bool) -> None:
        window, mode = self._window, self._mode
        self._window, self._mode = None, None
        if mode is not None:
            from torch.overrides import _get_current_function_mode_stack

            stack = _get_current_function_mode_stack()
            if stack and stack[-1] is mode:
                mode.__exit__(None, None, None)
            else:
                self._broken = True  # not ours to pop; it passes everything through from now on
        for key in window.keys if window is not None else []:
            self._judged(key, feeds)

    # -- the marks ---------------------------------------------------------------------------------
    def _mark(self, output: Any) -> None:
        window = self._window
        if window is not None:
            for tensor in _tensors(self.torch, output):
                window.marked[id(tensor)] = tensor

    def _followed(self, args: Any, kwargs: Any, out: Any) -> None:
        window = self._window
        if window is None or window.overflowed:
            return
        window.ops += 1
        if window.ops > MAX_OPS:  # closed at the next backward or step: the mode is not ours to pop in here
            window.overflowed = True
            window.marked.clear()
            return
        marked = window.marked
        if any(id(t) in marked for t in _tensors(self.torch, args)) or (kwargs and any(id(t) in marked for t in _tensors(self.torch, list(kwargs.values())))):
            self._mark(out)

    def close(self) -> None:
        """At the end of the run: a window still open fed no backward."""
        if self._window is not None:
            self._close(feeds=False)


def _tensors(torch: Any, value: Any) -> list[Any]:
    """The tensors in `value`: itself, or those in a list, tuple or dict up to two levels deep."""
    if isinstance(value, torch.Tensor):
        return [value]
    found: list[Any] = []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            found.extend(i for i in item if isinstance(i, torch.Tensor))
    return found

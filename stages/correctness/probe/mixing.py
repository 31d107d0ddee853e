"""Instrument charting the dependencies between the samples of one batch (batch-mixing): the
"use backprop to chart dependencies" check of Karpathy's recipe, on a batch the run used.

Until the first optimizer step, global forward hooks keep the first outermost module call made
with gradients recorded by each module with trainable parameters: the module and a copy of its
arguments (the model and its first training batch). The latest DataLoader batch's size says
which dimension of the input holds the samples. When the run has ended (`collect`), the model
is put in eval mode (BatchNorm's coupling through batch statistics is legitimate in training)
and called once more on that batch; the gradient of the outputs of sample i (the first and the
last) with respect to the input of every sample j must be zero for j != i. Integer inputs
(token ids) are followed from the first floating module output that holds the batch.

When it is not, two more forwards without gradients put NaN into sample a's input, then
sample b's, under a `TorchFunctionMode` keeping where each op's output is NaN: the first op
whose output has an element NaN in both runs is where the samples first mix, located at the
target's line that called it. An op before it that laid the batch out so that no dimension of
the batch's size holds one sample per index (`x.view(T, B, F)` where `transpose` was meant)
is named too.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

from . import mixing_replay
from ...harness.sites import SiteTable
from ...harness.identity import ObjectMap
from ...harness.faults import guarded

MAX_CAPTURES = 4
RAISED = object()  # `_leave`'s output where the forward raised (torch passes none)


@dataclass
class Capture:
    module: Any  # held until the run ends: the model is usually gone by then
    args: Any
    kwargs: dict[str, Any]
    batch_size: int | None  # the latest DataLoader batch's size, None without a DataLoader
    loader_shapes: set[tuple[int, ...]]  # the shapes of that batch's tensors
    site: int | None  # the target's line that called the module
    autocast: list[tuple[str, Any]]  # (device type, dtype) of each autocast context enabled


class BatchMixingWatch:
    def __init__(self) -> None:
        self.sites: SiteTable | None = None
        self.captures: list[Capture] = []
        self.batch_size: int | None = None
        self.loader_shapes: set[tuple[int, ...]] = set()
        self.trained: set[int] = set()  # ids of the parameters the first optimizer steps held
        self._trained_held: list[Any] = []  # those parameters, so that no other tensor takes their ids
        self.steps = 0
        self._trainable: ObjectMap[bool] = ObjectMap()  # by identity: a module made later may get a freed one's id
        self._handles: list[Any] = []
        self._tls = threading.local()

    def install(self, ctx: Any) -> None:
        import torch
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        self.torch = torch
        self.sites = SiteTable(ctx.root)
        original_next = _BaseDataLoaderIter.__next__
        watch = self

        @functools.wraps(original_next)
        def next_batch(iterator: Any) -> Any:
            batch = original_next(iterator)
            if not watch.steps:
                watch.batch_size, watch.loader_shapes = mixing_replay.loader_batch(torch, batch)
            return batch

        _BaseDataLoaderIter.__next__ = next_batch  # type: ignore[method-assign,assignment]  # patched while the run lasts
        self._handles = [
            register_module_forward_pre_hook(guarded(self._enter)),
            register_module_forward_hook(guarded(self._leave), with_kwargs=True, always_call=True),
        ]
        register_optimizer_step_pre_hook(guarded(self._on_step))

    def _enter(self, module: Any, args: Any) -> None:
        self._tls.depth = getattr(self._tls, "depth", 0) + 1

    def _leave(self, module: Any, args: Any, kwargs: Any, output: Any = RAISED) -> None:
        """An outermost call that just returned: kept when it is the first of a trainable module
        with gradients recorded (its arguments, as the global pre-hook cannot see keywords).
        Where the forward raised, torch calls it as (module, args, result): nothing is kept."""
        depth = self._tls.depth = max(0, getattr(self._tls, "depth", 1) - 1)
        if output is RAISED or depth or len(self.captures) >= MAX_CAPTURES or not self.torch.is_grad_enabled() or self.torch.compiler.is_compiling():
            return
        trainable = self._trainable.get(module)
        if trainable is None:
            trainable = self._trainable[module] = any(p.requires_grad for p in module.parameters())
        if not trainable or any(c.module is module for c in self.captures):
            return
        assert self.sites is not None
        copy = functools.partial(mixing_replay.copy_tensors, self.torch)
        self.captures.append(Capture(module, copy(args), copy(kwargs), self.batch_size, self.loader_shapes, self.sites.innermost(1), mixing_replay.autocast_state(self.torch)))

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if self.steps == 1:
            self._trained_held = [p for group in optimizer.param_groups for p in group["params"]]
            self.trained = {id(p) for p in self._trained_held}
            for handle in self._handles:  # one batch is enough: the hooks cost nothing from here on
                handle.remove()

    def collect(self) -> dict[str, Any]:
        from .payloads import MixingPayload  # at collect(): no start-up cost

        assert self.sites is not None
        capture = self._model_capture()
        result: dict[str, Any] = {"steps": self.steps, "captured": len(self.captures), "site": capture.site if capture else None}
        if capture is None:
            result.update(applicable=False, reason="no module with trainable parameters was called with gradients recorded before the first optimizer step")
        else:
            result.update(mixing_replay.judge(self.torch, capture, self.sites))
        return MixingPayload.sent({**result, "sites": self.sites.sites})

    def _model_capture(self) -> Capture | None:
        """The captured call of the module the first optimizer step trained, else the first."""
        trained = [c for c in self.captures if any(id(p) in self.trained for p in c.module.parameters())]
        chosen = trained or self.captures
        return chosen[0] if chosen else None

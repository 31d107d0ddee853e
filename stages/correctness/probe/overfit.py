"""Instrument for the one-batch overfit run: every DataLoader hands out its first batch again
and again, and the run ends after `overfit_steps` optimizer steps.

The loader is still iterated as the target wrote it (its epochs end where they did), only
each batch is replaced by a copy of the loader's first one; the losses are kept by the loss
instrument. The run ends by raising `OverfitStepsDone` (a BaseException, so the target's
`except Exception` lets it through) from the step post-hook.
"""

from __future__ import annotations

import functools
from typing import Any

from ...harness.identity import ObjectMap
from ...harness.faults import guarded

STOP = "OverfitStepsDone"


class OverfitStepsDone(BaseException):
    """Raised after the configured number of optimizer steps; the stage expects it."""


class OneBatch:
    def __init__(self) -> None:
        self.steps = 0
        self.limit = 0
        self.batches_repeated = 0
        self.loaders = 0

    def install(self, ctx: Any) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.utils._pytree import tree_map
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        self.limit = int(ctx.options.get("correctness", {}).get("overfit_steps", 0))
        # Dataset -> its loader's first batch, by identity: a dataset made after another was
        # freed may get its id(), and must not be given the freed one's batch.
        first: ObjectMap[Any] = ObjectMap()
        watch = self
        original_next = _BaseDataLoaderIter.__next__

        def copy(value: Any) -> Any:
            return value.clone() if isinstance(value, torch.Tensor) else value

        @functools.wraps(original_next)
        def next_batch(iterator: Any) -> Any:
            batch = original_next(iterator)
            dataset = iterator._dataset
            if dataset not in first:
                first[dataset] = tree_map(copy, batch)
                watch.loaders += 1
                return batch
            watch.batches_repeated += 1
            return tree_map(copy, first.get(dataset))

        _BaseDataLoaderIter.__next__ = next_batch  # type: ignore[method-assign,assignment]  # patched while the run lasts
        register_optimizer_step_post_hook(guarded(self._on_step))

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if self.limit and self.steps >= self.limit:
            raise OverfitStepsDone(f"{self.steps} optimizer steps on one batch")

    def collect(self) -> dict[str, Any]:
        from .payloads import OneBatchPayload  # at collect(): no start-up cost

        return OneBatchPayload.sent({"steps": self.steps, "limit": self.limit, "loaders": self.loaders, "batches_repeated": self.batches_repeated, "stop": STOP})

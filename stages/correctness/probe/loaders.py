"""Instrument recording which DataLoaders fed optimizer steps, and how they order their data.

`DataLoader.__init__` is wrapped to keep where each loader was built; `DataLoader.__iter__`
(one call per epoch) and the iterator's `__next__` to know which loader handed out the batch
before each optimizer step; `DistributedSampler.set_epoch` to count its calls. A loader that
drives steps with a `SequentialSampler` sees its data in the same order every epoch; a
`DistributedSampler` whose `set_epoch` is never called shuffles every epoch the same way.

Every sample of every batch handed out is fingerprinted (the hash of up to `SAMPLED` evenly
spaced elements of the batch's first tensor, per sample). When the run ends, the samples of
each loader that drove no optimizer step (an evaluation loader) are compared with those of
each loader that drove steps (data-leakage); a loader over the same dataset object as the
training loader (a train-accuracy pass on purpose) is not compared, nor a loader whose first
epoch handed out one content twice (data with repeated samples, where equal content is no
evidence that a sample is shared).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from ...harness.sites import SiteTable
from ...harness.faults import guarded

MAX_LOADERS = 200
SAMPLED = 64  # elements of a sample its fingerprint reads
MAX_SAMPLES = 200_000  # distinct samples fingerprinted per loader
MIN_OVERLAP_SHARE = 0.05  # below it (or a single sample), taken for duplicates in the data


class LoaderWatch:
    def __init__(self) -> None:
        self.sites: SiteTable | None = None
        self.loaders: list[dict[str, Any]] = []
        self._records: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self._iterators: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self._set_epoch: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._kept: list[Any] = []  # the loaders, read once more at the end
        self.current: dict[str, Any] | None = None
        self._samples: dict[int, set[int]] = {}  # id(record) -> its samples' fingerprints
        self._datasets: dict[int, int] = {}  # id(record) -> id(its dataset), kept alive by the loader
        self._repeats: dict[int, int] = {}  # id(record) -> samples its first epoch handed out twice

    def install(self, ctx: Any) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        from torch.utils.data import DataLoader, DistributedSampler
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        self.sites = SiteTable(ctx.root)
        watch = self
        original_init, original_iter, original_next = DataLoader.__init__, DataLoader.__iter__, _BaseDataLoaderIter.__next__
        original_set_epoch = DistributedSampler.set_epoch

        @functools.wraps(original_init)
        def init(loader: Any, *args: Any, **kwargs: Any) -> None:
            original_init(loader, *args, **kwargs)
            if len(watch.loaders) < MAX_LOADERS:
                assert watch.sites is not None
                record = {"site": watch.sites.innermost(1), "epochs": 0, "batches": 0, "steps": 0, "samples": 0}
                watch.loaders.append(record)
                watch._records[loader] = record
                watch._kept.append(loader)
                watch._datasets[id(record)] = id(loader.dataset)

        @functools.wraps(original_iter)
        def iterate(loader: Any) -> Any:
            iterator = original_iter(loader)
            record = watch._records.get(loader)
            if record is not None:
                record["epochs"] += 1
                watch._iterators[iterator] = record
            return iterator

        @functools.wraps(original_next)
        def next_batch(iterator: Any) -> Any:
            batch = original_next(iterator)
            record = watch._iterators.get(iterator)
            if record is not None:
                record["batches"] += 1
                watch.current = record
                watch._fingerprint(record, batch)
            return batch

        @functools.wraps(original_set_epoch)
        def set_epoch(sampler: Any, epoch: int) -> None:
            watch._set_epoch[sampler] = watch._set_epoch.get(sampler, 0) + 1
            original_set_epoch(sampler, epoch)

        DataLoader.__init__ = init  # type: ignore[method-assign,assignment]  # patched while the run lasts
        DataLoader.__iter__ = iterate  # type: ignore[method-assign]  # patched while the run lasts
        _BaseDataLoaderIter.__next__ = next_batch  # type: ignore[method-assign,assignment]  # patched while the run lasts
        DistributedSampler.set_epoch = set_epoch  # type: ignore[method-assign,assignment]
        register_optimizer_step_pre_hook(guarded(self._on_step))

    def _fingerprint(self, record: dict[str, Any], batch: Any) -> None:
        import torch

        samples = self._samples.setdefault(id(record), set())
        tensor = _first_tensor(torch, batch)
        if tensor is not None and tensor.dim() > 0:
            record["samples"] = record.get("samples", 0) + int(tensor.shape[0])
        if tensor is None or tensor.dim() == 0 or len(samples) >= MAX_SAMPLES:
            return
        rows = tensor.detach().reshape(tensor.shape[0], -1)
        if rows.shape[1] > SAMPLED:
            rows = rows[:, torch.linspace(0, rows.shape[1] - 1, SAMPLED, dtype=torch.float64).long()]
        hashes = [hash(tuple(row)) for row in rows.cpu().tolist()]
        before = len(samples)
        samples.update(hashes)
        if record["epochs"] <= 1:
            self._repeats[id(record)] = self._repeats.get(id(record), 0) + len(hashes) - (len(samples) - before)

    def overlaps(self) -> list[dict[str, Any]]:
        """Evaluation loaders whose samples a training loader also handed out."""
        found = []
        for e_index, evaluated in enumerate(self.loaders):
            seen = self._samples.get(id(evaluated), set())
            if evaluated["steps"] or not seen or self._repeats.get(id(evaluated)):
                continue  # a training loader, or data whose samples repeat: equal content is no evidence of a shared sample
            for t_index, trained in enumerate(self.loaders):
                if not trained["steps"] or self._datasets.get(id(trained)) == self._datasets.get(id(evaluated)) or self._repeats.get(id(trained)):
                    continue  # not training, the training data itself on purpose, or data whose samples repeat
                fed = self._samples.get(id(trained), set())
                overlap = len(seen & fed)
                if overlap > 1 and overlap >= MIN_OVERLAP_SHARE * len(seen):
                    found.append({"trained": t_index, "evaluated": e_index, "overlap": overlap, "evaluated_samples": len(seen), "trained_samples": len(fed)})
        return found

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.current is not None:
            self.current["steps"] += 1

    def collect(self) -> dict[str, Any]:
        from .payloads import LoadersPayload  # at collect(): no start-up cost

        assert self.sites is not None
        for loader in self._kept:
            record = self._records.get(loader)
            if record is not None:
                record.update(_ordering(loader, self._set_epoch))
        return LoadersPayload.sent({"loaders": self.loaders, "overlaps": self.overlaps(), "sites": self.sites.sites})


def _ordering(loader: Any, set_epoch_calls: Any) -> dict[str, Any]:
    """How the loader orders its data: the class of the sampler its batches are drawn from,
    and for a DistributedSampler whether it shuffles and how often its epoch was set."""
    sampler = loader.sampler
    batch_sampler = loader.batch_sampler
    # The batch sampler orders the data whenever there is one: a loader built around another
    # loader's batch sampler (Accelerate's `prepare`, the Hugging Face Trainer's loader) keeps
    # a default SequentialSampler as its `sampler`, which it never draws from.
    inner = getattr(batch_sampler, "sampler", None) if batch_sampler is not None else sampler
    try:
        length: int | None = len(loader)
    except TypeError:
        length = None
    return {
        "sampler": type(inner).__name__ if inner is not None else type(batch_sampler).__name__,
        "sampler_module": type(inner).__module__ if inner is not None else type(batch_sampler).__module__,
        "batch_sampler": type(batch_sampler).__name__ if batch_sampler is not None else None,
        "sampler_shuffles": bool(getattr(inner, "shuffle", False)),
        "set_epoch_calls": set_epoch_calls.get(inner, 0) if inner is not None else 0,
        "length": length,
        "iterable_dataset": type(sampler).__name__ == "_InfiniteConstantSampler",
    }


def _first_tensor(torch: Any, batch: Any) -> Any:
    """The batch's inputs: itself, or the first tensor of a tuple, list or dict."""
    if isinstance(batch, torch.Tensor):
        return batch
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return next((item for item in items if isinstance(item, torch.Tensor)), None)

"""Instrument for one rank of a distributed run: what the ranks' results are compared on.

- every module the run constructs, with the target's line that built it (the line that calls
  the class, not its own `super().__init__()`); at the end, each root module's parameters and
  buffers: a digest of all their bytes and their values (all of them up to `EXACT_NUMEL`
  elements, else `SAMPLES` evenly spaced ones);
- the parameters' digests before the first optimizer step (after DistributedDataParallel
  broadcast rank 0's weights, when it wraps the model);
- every DistributedDataParallel built: where, around which module, with `broadcast_buffers`;
- every `torch.manual_seed` call the target makes: where, with which seed;
- every DataLoader: where it was built, its sampler, the optimizer steps it fed and the digest
  of each batch it handed out (the first `MAX_BATCHES`).
Digests are BLAKE2b over dtype, shape and bytes, so two ranks' tensors are identical exactly
when their digests are.
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
import weakref
from types import FrameType
from typing import Any

from ...harness.tensors import even_indexes
from ...harness.sites import SiteTable
from ...harness.faults import guarded

EXACT_NUMEL = 4096
SAMPLES = 1024
MAX_TENSORS = 2000
MAX_MODULES = 20_000
MAX_LOADERS = 50
MAX_BATCHES = 64
MAX_SEEDS = 50


class RankWatch:
    def __init__(self) -> None:
        self.sites: SiteTable | None = None
        self.modules: list[tuple[Any, int | None]] = []
        self.ddp: list[dict[str, Any]] = []
        self._ddp_modules: list[Any] = []
        self.seeds: list[dict[str, Any]] = []
        self.loaders: list[dict[str, Any]] = []
        self._records: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self._iterators: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self.current: dict[str, Any] | None = None
        self.steps = 0
        self.initial: dict[str, str] | None = None

    def install(self, ctx: Any) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        self.torch = torch
        self.sites = SiteTable(ctx.root)
        self._watch_loaders(DataLoader, _BaseDataLoaderIter)
        watch = self
        module_init, ddp_init, seed = torch.nn.Module.__init__, DistributedDataParallel.__init__, torch.manual_seed

        @functools.wraps(module_init)
        def module_made(module: Any, *args: Any, **kwargs: Any) -> None:
            module_init(module, *args, **kwargs)
            if len(watch.modules) < MAX_MODULES:
                watch.modules.append((module, watch._construction_site(module)))

        @functools.wraps(ddp_init)
        def ddp_made(wrapper: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            ddp_init(wrapper, module, *args, **kwargs)
            watch._ddp_modules.append(module)
            watch.ddp.append(
                {"site": watch._construction_site(wrapper), "module": type(module).__name__, "broadcast_buffers": bool(getattr(wrapper, "broadcast_buffers", True))}
            )

        @functools.wraps(seed)
        def manual_seed(value: Any) -> Any:
            assert watch.sites is not None
            site = watch.sites.innermost(1)
            if site is not None and len(watch.seeds) < MAX_SEEDS:
                watch.seeds.append({"site": site, "seed": int(value)})
            return seed(value)

        torch.nn.Module.__init__ = module_made  # type: ignore[method-assign,assignment]  # patched while the run lasts
        DistributedDataParallel.__init__ = ddp_made  # type: ignore[method-assign,assignment]
        torch.manual_seed = manual_seed  # type: ignore[assignment]
        register_optimizer_step_pre_hook(guarded(self._on_step))

    def _watch_loaders(self, DataLoader: Any, _BaseDataLoaderIter: Any) -> None:
        """Every DataLoader, the iterators it hands out, and a digest of each batch they yield."""
        watch = self
        loader_init, loader_iter, loader_next = DataLoader.__init__, DataLoader.__iter__, _BaseDataLoaderIter.__next__

        @functools.wraps(loader_init)
        def loader_made(loader: Any, *args: Any, **kwargs: Any) -> None:
            loader_init(loader, *args, **kwargs)
            if len(watch.loaders) < MAX_LOADERS:
                assert watch.sites is not None
                sampler = getattr(loader.batch_sampler, "sampler", None) or loader.sampler
                record: dict[str, Any] = {"site": watch.sites.innermost(1), "sampler": type(sampler).__name__, "batches": 0, "steps": 0, "digests": []}
                watch.loaders.append(record)
                watch._records[loader] = record

        @functools.wraps(loader_iter)
        def iterate(loader: Any) -> Any:
            iterator = loader_iter(loader)
            record = watch._records.get(loader)
            if record is not None:
                watch._iterators[iterator] = record
            return iterator

        @functools.wraps(loader_next)
        def next_batch(iterator: Any) -> Any:
            batch = loader_next(iterator)
            record = watch._iterators.get(iterator)
            if record is not None:
                record["batches"] += 1
                if len(record["digests"]) < MAX_BATCHES:
                    record["digests"].append(watch._batch_digest(batch))
                watch.current = record
            return batch

        DataLoader.__init__ = loader_made
        DataLoader.__iter__ = iterate
        _BaseDataLoaderIter.__next__ = next_batch

    def _construction_site(self, module: Any) -> int | None:
        """The target's line that built `module`: the innermost target frame that is not one
        of the module's own `__init__`s (a subclass's `super().__init__()` line)."""
        assert self.sites is not None
        frame: FrameType | None = sys._getframe(2)
        while frame is not None:
            if not (frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is module):
                index = self.sites.intern(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name) if _is_target(self.sites, frame) else None
                if index is not None:
                    return index
            frame = frame.f_back
        return None

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if self.current is not None:
            self.current["steps"] += 1
        if self.initial is None:
            self.initial = {t["name"]: t["digest"] for t in self._tensors(values=False) if t["kind"] == "parameter"}

    def _batch_digest(self, batch: Any) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for tensor in _tensors_in(batch, self.torch):
            digest.update(_tensor_digest(tensor, self.torch).encode())
        return digest.hexdigest()

    def _roots(self) -> list[tuple[Any, int | None]]:
        children: set[int] = set()
        for module, _ in self.modules:
            for _name, sub in module.named_modules():
                if sub is not module:
                    children.add(id(sub))
        return [(module, site) for module, site in self.modules if id(module) not in children]

    def _tensors(self, *, values: bool) -> list[dict[str, Any]]:
        """Every parameter and buffer of the root modules, named `Root[i].qualified.name`."""
        torch = self.torch
        wrapped = {id(m) for m in self._ddp_modules}
        built_at = {id(module): site for module, site in self.modules}
        found: list[dict[str, Any]] = []
        seen: set[int] = set()
        for index, (root, site) in enumerate(self._roots()):
            inside = {id(sub) for m in root.modules() if id(m) in wrapped for sub in m.modules()}
            for module_name, module in root.named_modules():
                members = [("parameter", n, t) for n, t in module.named_parameters(recurse=False)]
                members += [("buffer", n, t) for n, t in module.named_buffers(recurse=False)]
                for kind, name, tensor in members:
                    if tensor is None or id(tensor) in seen or len(found) >= MAX_TENSORS:
                        continue
                    seen.add(id(tensor))
                    qualified = f"{module_name}.{name}" if module_name else name
                    record: dict[str, Any] = {
                        "name": f"{type(root).__name__}[{index}].{qualified}",
                        "kind": kind,
                        "module": type(module).__name__,
                        "site": site,  # where the root module was built
                        "module_site": built_at.get(id(module), site),  # where the module holding it was built
                        "in_ddp": id(module) in inside,
                        "shape": list(tensor.shape),
                        "digest": _tensor_digest(tensor, torch),
                    }
                    if values:
                        record.update(_values(tensor, torch))
                    found.append(record)
        return found

    def collect(self) -> dict[str, Any]:
        from .payloads import RanksPayload  # at collect(): no start-up cost

        assert self.sites is not None
        return RanksPayload.sent({
            "steps": self.steps,
            "tensors": self._tensors(values=True),
            "initial": self.initial or {},
            "ddp": self.ddp,
            "seeds": self.seeds,
            "loaders": self.loaders,
            "sites": self.sites.sites,
        })


def _is_target(sites: SiteTable, frame: FrameType) -> bool:
    from ...common.frames import is_target_file

    return is_target_file(frame.f_code.co_filename, sites.root)


def _tensors_in(batch: Any, torch: Any, depth: int = 0) -> list[Any]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if depth > 3:
        return []
    if isinstance(batch, dict):
        return [t for key in sorted(batch, key=str) for t in _tensors_in(batch[key], torch, depth + 1)]
    if isinstance(batch, (list, tuple)):
        return [t for item in batch for t in _tensors_in(item, torch, depth + 1)]
    return []


def _tensor_digest(tensor: Any, torch: Any) -> str:
    with torch.no_grad():
        flat = tensor.detach().reshape(-1).contiguous().cpu()
        digest = hashlib.blake2b(f"{flat.dtype}{list(tensor.shape)}".encode(), digest_size=16)
        if flat.numel():
            # The bytes through a compact copy's storage: no numpy, which a target need not have.
            digest.update(bytes(flat.view(torch.uint8).clone().untyped_storage()))
        return digest.hexdigest()


def _values(tensor: Any, torch: Any) -> dict[str, Any]:
    """All the tensor's values up to EXACT_NUMEL elements, else SAMPLES evenly spaced ones;
    non-finite values as their repr (JSON has no NaN)."""
    with torch.no_grad():
        flat = tensor.detach().reshape(-1).cpu()
        sampled = flat.numel() > EXACT_NUMEL
        if sampled:
            flat = flat[even_indexes(torch, flat.numel(), SAMPLES, flat.device)]
        numbers = flat.double().tolist() if flat.is_floating_point() or not flat.is_complex() else []
    return {"values": [v if math.isfinite(v) else repr(v) for v in numbers], "sampled": sampled, "numel": tensor.numel()}

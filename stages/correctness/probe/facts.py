"""Instrument recording a few facts about how the run trained, for a later version to be
compared with (`correctness.baseline`, docs/baseline-comparison.md).

Per optimizer step: the learning rate of each group, the gradient norm of each group and the
relative change of each group's parameters (||after - before|| / ||before||). At the end: for
each top-level module, the relative change of its parameters over the run, and for each
weight matrix up to MAX_MATRIX elements, how many distinct rows it holds (a symmetric
initialisation leaves every row alike). A copy of the parameters is kept across one `step()`
(in buffers allocated once) and from the first step to the end, only while both together hold
up to MAX_COPIED elements; past that the changes are not recorded. Whether a model evaluated
under no_grad gives the same output twice for the same input: `probe.evaluation`.
"""

from __future__ import annotations

import functools
from typing import Any

from .evaluation import EvaluationWatch
from ...harness import heap
from ...harness.faults import call_original, guarded

MAX_STEPS = 500  # steps recorded; the rest are counted
MAX_COPIED = 20_000_000  # elements: the step buffers and the first step's copy together
MAX_MATRIX = 1_000_000
MAX_MATRICES = 200


class FactsWatch:
    def __init__(self) -> None:
        self.steps = 0
        self.optimizers: list[Any] = []  # kept alive: their id()s stay theirs
        self._index: dict[int, int] = {}
        self._before: dict[int, list[Any]] = {}
        self._buffers: dict[int, list[list[Any]]] = {}
        self._start: dict[int, Any] = {}  # id(parameter) -> its copy at the first step
        self._held: list[Any] = []
        self.records: list[dict[str, Any]] = []
        self.copying = True
        self.sites: Any = None
        self.scheduler_sites: dict[int, int] = {}  # line of a scheduler's step() -> calls there
        self.init_sites: dict[int, int] = {}  # id(tensor) -> the line of its latest torch.nn.init call

    def install(self, ctx: Any) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        from ...harness.sites import SiteTable

        self.torch = torch
        self.sites = SiteTable(ctx.root)
        self.evaluation = EvaluationWatch(self.sites)
        self.evaluation.install(torch)
        self._wrap_scheduler_step(torch)
        self._wrap_init(torch)
        register_optimizer_step_pre_hook(guarded(self._pre))
        register_optimizer_step_post_hook(guarded(self._post))

    def _wrap_scheduler_step(self, torch: Any) -> None:
        original = torch.optim.lr_scheduler.LRScheduler.step
        watch = self

        @functools.wraps(original)
        def stepped(scheduler: Any, *args: Any, **kwargs: Any) -> Any:
            site = watch.sites.innermost(1)
            if site is not None:
                watch.scheduler_sites[site] = watch.scheduler_sites.get(site, 0) + 1
            return call_original(original, scheduler, *args, **kwargs)

        torch.optim.lr_scheduler.LRScheduler.step = stepped

    def _wrap_init(self, torch: Any) -> None:
        """Each in-place initialiser of torch.nn.init notes the target line that called it."""
        watch = self
        for name in dir(torch.nn.init):
            original = getattr(torch.nn.init, name)
            if not name.endswith("_") or name.startswith("_") or not callable(original):
                continue

            def wrapper(tensor: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
                site = watch.sites.innermost(1)
                if site is not None:
                    watch.init_sites[id(tensor)] = site
                return __original(tensor, *args, **kwargs)

            setattr(torch.nn.init, name, functools.wraps(original)(wrapper))

    def _params(self, optimizer: Any) -> list[list[Any]]:
        return [[p for p in group["params"] if p.is_floating_point()] for group in optimizer.param_groups]

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        torch = self.torch
        if id(optimizer) not in self._index:
            self._index[id(optimizer)] = len(self.optimizers)
            self.optimizers.append(optimizer)
        if self.steps >= MAX_STEPS:
            return  # not recorded: nothing to prepare
        groups = self._params(optimizer)
        if self.copying and 2 * sum(p.numel() for group in groups for p in group) > MAX_COPIED:
            self.copying = False  # the buffers of the step and the first step's copy: twice the parameters
        with torch.no_grad():
            if self.copying:
                self._before[id(optimizer)] = self._copies(optimizer, groups)
                for group in groups:
                    for p in group:
                        if id(p) not in self._start:
                            self._start[id(p)] = p.detach().clone()
                            self._held.append(p)
            self._grads = [_norm(torch, [p.grad for p in group if p.grad is not None]) for group in groups]

    def _copies(self, optimizer: Any, groups: list[list[Any]]) -> list[list[Any]]:
        """The parameters copied into this optimizer's buffers of the last step (allocated
        once: a fresh copy at every step costs more than the step of a large model)."""
        buffers = self._buffers.get(id(optimizer))
        shapes = [[(p.shape, p.dtype, p.device) for p in group] for group in groups]
        if buffers is None or [[(b.shape, b.dtype, b.device) for b in group] for group in buffers] != shapes:
            buffers = self._buffers[id(optimizer)] = [[p.detach().clone() for p in group] for group in groups]
            return buffers
        for group, copies in zip(groups, buffers, strict=True):
            if copies:
                self.torch._foreach_copy_(copies, [p.detach() for p in group])
        return buffers

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        torch = self.torch
        index, self.steps = self.steps, self.steps + 1
        before = self._before.pop(id(optimizer), None)
        if index >= MAX_STEPS:
            return
        groups = self._params(optimizer)
        changes: list[float | None] = [None] * len(groups)
        if before is not None and [len(g) for g in before] == [len(g) for g in groups]:
            with torch.no_grad():
                changes = [_relative(torch, old, new) for old, new in zip(before, groups, strict=True)]
        self.records.append({
            "step": index,
            "optimizer": self._index[id(optimizer)],
            "lrs": [_number(group.get("lr")) for group in optimizer.param_groups],
            "grad_norms": [_float(g) for g in getattr(self, "_grads", [])],
            "changes": changes,
        })

    def collect(self) -> dict[str, Any]:
        from .payloads import FactsPayload  # at collect(): no start-up cost

        return FactsPayload.sent({
            "steps": self.steps,
            "records": self.records,
            "copied": self.copying,
            "modules": self._modules(),
            "matrices": self._matrices(),
            "scheduler_sites": [{"site": site, "steps": count} for site, count in self.scheduler_sites.items()],
            "evaluation": self.evaluation.collect(),
            "sites": self.sites.sites,
        })

    def _named(self) -> list[tuple[str, Any]]:
        """(name, parameter) of every parameter the optimizers hold, named in the module tree
        that holds it (found through the garbage collector's view of the live modules)."""
        held = {id(p): p for o in self.optimizers for group in o.param_groups for p in group["params"]}
        named: dict[int, tuple[str, Any]] = {}
        for root in heap.roots(heap.live(self.torch.nn.Module)):
            for name, p in heap.named_parameters(root):
                if id(p) in held and id(p) not in named:
                    named[id(p)] = (name, p)
        return sorted(named.values(), key=lambda item: item[0])

    def _modules(self) -> list[dict[str, Any]]:
        torch = self.torch
        if not self.copying:
            return []
        by_module: dict[str, list[Any]] = {}
        for name, p in self._named():
            if id(p) in self._start:
                by_module.setdefault(name.split(".")[0] if "." in name else "", []).append(p)
        with torch.no_grad():
            return [
                {"module": module, "change": _relative(torch, [self._start[id(p)] for p in params], params)}
                for module, params in sorted(by_module.items())
            ]

    def _matrices(self) -> list[dict[str, Any]]:
        torch = self.torch
        found = []
        with torch.no_grad():
            for name, p in self._named():
                if p.dim() != 2 or p.numel() > MAX_MATRIX or p.shape[0] < 2 or not p.is_floating_point():
                    continue
                distinct = int(torch.unique(p.detach().cpu(), dim=0).shape[0])
                found.append({"name": name, "rows": int(p.shape[0]), "distinct": distinct, "init_site": self.init_sites.get(id(p))})
                if len(found) >= MAX_MATRICES:
                    break
        return found


def _norm(torch: Any, tensors: list[Any]) -> Any:
    if not tensors:
        return None
    # Each norm in the tensor's own precision, combined in float64.
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.detach()).double() for t in tensors]))


def _relative(torch: Any, old: list[Any], new: list[Any]) -> float | None:
    """||new - old|| / ||old|| over the group; None where old is all zero and nothing moved."""
    if not old:
        return None
    delta = _norm(torch, [n.detach() - o for o, n in zip(old, new, strict=True)])
    base = _norm(torch, old)
    moved, size = float(delta), float(base)
    if size == 0.0:
        return None if moved == 0.0 else float("inf")
    return moved / size


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None

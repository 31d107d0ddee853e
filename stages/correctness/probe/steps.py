"""Instrument watching every optimizer step: did it change its parameters, which parameters
ever received a gradient, and which model parameters no optimizer holds.

Step pre/post hooks (`torch.optim.optimizer.register_optimizer_step_{pre,post}_hook`) take a
fingerprint of each parameter before and after `step()`: its sum, its L2 norm and up to
`SAMPLES` evenly spaced elements, exactly, on the parameter's device (no copy of the weights,
one host read per step), in the parameter's own precision whatever its dtype (float64 stays
float64). A parameter whose fingerprint is identical after the step did not change: a dense
update moves the sampled elements, a sparse one (a few embedding rows) the sum and norm. Each
step is compared across itself (a fingerprint right before it and one right after), never
with the previous step's: a target that changes parameters between steps (an EMA update of
a target network the optimizer also holds) must not make an ineffective step look effective.
At an ineffective step, `probe.causes` says why nothing moved.

`torch.nn.Module.__init__` is wrapped to keep each module the run constructs, with the line of
the target that constructed it, so that a parameter can be named by its qualified name in
its root module (`encoder.layers.3.attn.proj.weight`) and located where its module is built.
"""

from __future__ import annotations

import functools
from typing import Any

from ...harness.tensors import even_indexes, exact_dtype, exact_norm, exact_sum, real_values
from .causes import StepCauses
from .clipping import ClipWatch
from .cuts import CutWatch
from .optimizer_sites import OptimizerSites
from ...harness.sites import SiteTable
from ...harness.identity import ObjectMap
from ...harness.faults import guarded

SAMPLES = 32
MAX_STEP_RECORDS = 200  # ineffective steps kept in full; the rest are counted
MAX_MODULES = 20_000
MAX_NAMED = 200
# The first steps also look at the gradients of parameters no optimizer holds (they are never
# zeroed by the optimizer, so a gradient once received stays visible until the run ends).
FOREIGN_GRAD_CHECKS = 2


class StepWatch:
    def __init__(self) -> None:
        self.sites: SiteTable | None = None
        self.modules: list[tuple[Any, int | None]] = []  # (module, construction site); kept alive to name parameters at the end
        # Kept alive for the run, as `modules` is: the records below are keyed by the id()s of
        # the optimizers and of their and the modules' parameters, which no freed object's id
        # may then take.
        self.optimizers: list[Any] = []
        self._optimizer_index: dict[int, int] = {}
        self._before: dict[int, tuple[list[int], Any]] = {}  # optimizer -> (parameter ids, fingerprint before its step)
        self.causes: StepCauses | None = None
        self.clips: ClipWatch | None = None
        self.optimizer_sites: OptimizerSites | None = None  # where each optimizer was built
        self.cuts: CutWatch | None = None  # why a module that ran gave no gradient
        self._samples: dict[tuple[int, int], Any] = {}  # (parameter id, numel) -> sampled indexes
        self.grad_seen: set[int] = set()
        self.forwarded: set[int] = set()  # modules that ran a forward (unused-parameter: a head never called)
        self.changed: set[int] = set()
        self.steps = 0
        self.ineffective: list[dict[str, Any]] = []
        self.ineffective_count = 0
        self.step_sites: dict[int, int] = {}  # site -> steps made there
        # optimizer -> (class, construction site, the scheduler) of its schedulers; by identity, as an optimizer
        # may be freed before it steps and its id() pass to another
        self.schedulers: ObjectMap[list[tuple[str, int | None, Any]]] = ObjectMap()

    # -- installation -----------------------------------------------------------------------------
    def install(self, ctx: Any) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.torch = torch
        self.sites = SiteTable(ctx.root)
        self.causes = StepCauses(self.sites)
        self.causes.install(torch)
        self.clips = ClipWatch(self.sites, self.causes)
        self.clips.install(torch)
        self.optimizer_sites = OptimizerSites(self.sites)
        self.optimizer_sites.install(torch)
        self.cuts = CutWatch(self.sites, self.modules)
        self.cuts.install(torch)
        watch = self
        original_init = torch.nn.Module.__init__

        @functools.wraps(original_init)
        def module_init(module: Any, *args: Any, **kwargs: Any) -> None:
            original_init(module, *args, **kwargs)
            if len(watch.modules) < MAX_MODULES:
                assert watch.sites is not None
                watch.modules.append((module, watch.sites.innermost(1)))

        torch.nn.Module.__init__ = module_init  # type: ignore[method-assign,assignment]  # patched while the run lasts
        scheduler_init = torch.optim.lr_scheduler.LRScheduler.__init__

        @functools.wraps(scheduler_init)
        def scheduler_made(scheduler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> None:
            assert watch.sites is not None
            made = watch.schedulers.get(optimizer)
            if made is None:
                made = watch.schedulers[optimizer] = []
            made.append((type(scheduler).__name__, watch.sites.innermost(1), scheduler))
            scheduler_init(scheduler, optimizer, *args, **kwargs)

        torch.optim.lr_scheduler.LRScheduler.__init__ = scheduler_made  # type: ignore[method-assign,assignment]
        register_optimizer_step_pre_hook(guarded(self._pre))
        register_optimizer_step_post_hook(guarded(self._post))
        from torch.nn.modules.module import register_module_forward_pre_hook

        register_module_forward_pre_hook(guarded(self._ran))

    def _ran(self, module: Any, args: Any) -> None:
        # The modules are kept alive in `modules`: their id()s stay theirs.
        self.forwarded.add(id(module))

    # -- the hooks ----------------------------------------------------------------------------------
    def _params(self, optimizer: Any) -> list[Any]:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def _fingerprint(self, params: list[Any]) -> tuple[Any, list[int]]:
        """One flat tensor of every parameter's [sum, norm, samples...] and each one's end offset."""
        torch = self.torch
        parts, ends, end = [], [], 0
        with torch.no_grad():
            for p in params:
                flat = p.detach().reshape(-1)
                key = (id(p), flat.numel())
                index = self._samples.get(key)
                if index is None or index.device != flat.device:
                    index = self._samples[key] = even_indexes(torch, flat.numel(), SAMPLES, flat.device)
                part = _part(torch, flat, index)
                parts.append(part)
                end += part.numel()
                ends.append(end)
            if len({part.device for part in parts}) > 1:  # parameters on several devices
                parts = [part.cpu() for part in parts]
            return (torch.cat(parts) if parts else torch.zeros(0)), ends

    def _moved(self, before: Any, after: Any, ends: list[int]) -> list[bool]:
        torch = self.torch
        if before.shape != after.shape:
            return [True] * len(ends)  # a parameter was resized: not comparable, never called ineffective
        if before.device != after.device:
            before, after = before.cpu(), after.cpu()
        differs = torch.cat((torch.zeros(1, dtype=torch.long, device=after.device), (before != after).long().cumsum(0)))
        stops = torch.tensor(ends, device=after.device)
        starts = torch.cat((torch.zeros(1, dtype=torch.long, device=after.device), stops[:-1]))
        changed: list[bool] = ((differs[stops] - differs[starts]) > 0).tolist()  # one host read per step
        return changed

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        key = id(optimizer)
        if key not in self._optimizer_index:
            self._optimizer_index[key] = len(self.optimizers)
            self.optimizers.append(optimizer)
        params = self._params(optimizer)
        for p in params:
            if p.grad is not None:
                self.grad_seen.add(id(p))
        if self.steps < FOREIGN_GRAD_CHECKS:
            self._note_foreign_grads()
        if self.clips is not None and self.causes is not None:
            self.clips.judge(self.steps, params, self.causes.previous_backwards(optimizer))
        self._before[key] = ([id(p) for p in params], self._fingerprint(params)[0])

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        assert self.sites is not None
        saved = self._before.pop(id(optimizer), None)
        params = self._params(optimizer)
        index = self.steps
        self.steps += 1
        site = self.sites.innermost(1)
        if site is not None:
            self.step_sites[site] = self.step_sites.get(site, 0) + 1
        causes = self.causes
        previous_backwards = causes.previous_backwards(optimizer) if causes is not None else 0
        if causes is not None:
            causes.stepped(optimizer)
        if saved is None or saved[0] != [id(p) for p in params]:
            return  # the groups changed inside step(): nothing comparable
        after, ends = self._fingerprint(params)
        moved = self._moved(saved[1], after, ends) if params else []
        for p, did in zip(params, moved, strict=True):
            if did:
                self.changed.add(id(p))
        if any(moved) or not params:
            return
        self.ineffective_count += 1
        if len(self.ineffective) < MAX_STEP_RECORDS:
            lrs = [_number(group.get("lr")) for group in optimizer.param_groups]
            record = {
                "step": index,
                "optimizer": self._optimizer_index[id(optimizer)],
                "site": site,
                "lrs": lrs,
                "schedulers": [self._scheduler(name, made, scheduler) for name, made, scheduler in self.schedulers.get(optimizer, [])],
                "grads_present": sum(1 for p in params if p.grad is not None),
                "params": len(params),
            }
            if causes is not None:
                record.update(causes.cause(optimizer, params, lrs, previous_backwards))
            self.ineffective.append(record)

    def _scheduler(self, name: str, made: int | None, scheduler: Any) -> dict[str, Any]:
        step_site = self.causes.scheduler_steps.get(scheduler) if self.causes is not None else None
        return {"class": name, "site": made, **({"step_site": step_site} if step_site is not None else {})}

    def _note_foreign_grads(self) -> None:
        for module, _site in self.modules:
            for p in module.parameters(recurse=False):
                if p.grad is not None:
                    self.grad_seen.add(id(p))

    # -- the result ----------------------------------------------------------------------------------
    def collect(self) -> dict[str, Any]:
        from .payloads import StepsPayload  # at collect(): no start-up cost

        assert self.sites is not None
        self._note_foreign_grads()
        names = self._names()
        optimizers, in_group = self._optimizer_records(names)
        no_grad, never_changed = self._unmoved(in_group, names)
        outside = self._outside_optimizers(in_group, names)
        return StepsPayload.sent({
            "steps": self.steps,
            "optimizers": optimizers,
            "ineffective": [self._named_frozen(record, names) for record in self.ineffective],
            "ineffective_count": self.ineffective_count,
            "step_sites": [{"site": site, "steps": count} for site, count in self.step_sites.items()],
            "not_in_optimizer": outside[:MAX_NAMED],
            "not_in_optimizer_count": len(outside),
            "no_gradient": no_grad[:MAX_NAMED],
            "no_gradient_count": len(no_grad),
            "never_changed": never_changed[:MAX_NAMED],
            "never_changed_count": len(never_changed),
            "modules_seen": len(self.modules),
            "clip_calls": self.clips.calls if self.clips is not None else 0,
            "clips": self.clips.collect() if self.clips is not None else [],
            "non_finite_params": self._non_finite(),
            "sites": self.sites.sites,
        })

    def _optimizer_records(self, names: dict[int, tuple[Any, dict[str, Any]]]) -> tuple[list[dict[str, Any]], dict[int, tuple[int, int]]]:
        """Each optimizer's class, groups, construction site and the modules its parameters
        belong to (`Root:encoder.0`: which optimizer left a sibling out), and id(parameter) ->
        (optimizer, group) of the first group holding it."""
        in_group: dict[int, tuple[int, int]] = {}
        optimizers = []
        for o_index, optimizer in enumerate(self.optimizers):
            groups: list[dict[str, Any]] = []
            modules: list[str] = []
            for g_index, group in enumerate(optimizer.param_groups):
                for p in group["params"]:
                    in_group.setdefault(id(p), (o_index, g_index))
                    named = names.get(id(p))
                    if named is not None and len(modules) < MAX_NAMED:
                        modules.append(f"{named[1]['root']}:{named[1]['name'].rpartition('.')[0]}")
                groups.append({"lr": _number(group.get("lr")), "params": len(group["params"])})
            optimizers.append({
                "class": type(optimizer).__name__, "groups": groups, "site": self.optimizer_sites.site(optimizer) if self.optimizer_sites else None,
                "modules": list(dict.fromkeys(modules)),
            })
        return optimizers, in_group

    def _unmoved(self, in_group: dict[int, tuple[int, int]], names: dict[int, tuple[Any, dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The trainable parameters of the optimizers' groups (each in the first group holding it)
        that never received a gradient (with why, where a module ran), and those that received
        one but never changed over the run's steps."""
        no_grad, never_changed = [], []
        holding = {id(p): module for module, _ in self.modules for p in module.parameters(recurse=False)}
        for o_index, optimizer in enumerate(self.optimizers):
            for g_index, group in enumerate(optimizer.param_groups):
                for p in group["params"]:
                    if not p.requires_grad or in_group.get(id(p)) != (o_index, g_index):
                        continue
                    record = {**self._describe(p, names), "optimizer": o_index, "group": g_index, "lr": _number(group.get("lr"))}
                    if id(p) not in self.grad_seen:
                        module = holding.get(id(p))
                        cut = self.cuts.describe(module) if self.cuts is not None else {}
                        no_grad.append({**record, "forward_ran": (id(module) if module is not None else None) in self.forwarded, **cut})
                    elif id(p) not in self.changed and self.steps:
                        never_changed.append(record)
        return no_grad, never_changed

    def _outside_optimizers(self, in_group: dict[int, tuple[int, int]], names: dict[int, tuple[Any, dict[str, Any]]]) -> list[dict[str, Any]]:
        """The named trainable parameters no optimizer holds that received a gradient (none
        without an optimizer: nothing then says which parameters were meant to train)."""
        if not self.optimizers:
            return []
        return [self._describe(p, names) for p_id, (p, _) in names.items() if p.requires_grad and p_id not in in_group and p_id in self.grad_seen]

    def _named_frozen(self, record: dict[str, Any], names: dict[int, tuple[Any, dict[str, Any]]]) -> dict[str, Any]:
        """The record with its frozen parameters' ids replaced by their names (the optimizers,
        kept alive, keep those ids theirs)."""
        ids = record.get("frozen_ids")
        if ids is None:
            return record
        named = {key: value for key, value in record.items() if key != "frozen_ids"}
        named["frozen"] = [known[1]["name"] if (known := names.get(i)) is not None else None for i in ids]
        return named

    def _non_finite(self) -> list[str]:
        """The optimizers' parameters holding NaN or inf when the run ended (named where known)."""
        torch = self.torch
        names = self._names()
        found = []
        with torch.no_grad():
            for optimizer in self.optimizers:
                for p in self._params(optimizer):
                    if (p.is_floating_point() or p.is_complex()) and not bool(torch.isfinite(p).all()):
                        found.append(self._describe(p, names)["name"] or f"<parameter of shape {tuple(p.shape)}>")
        return found[:MAX_NAMED]

    def _names(self) -> dict[int, tuple[Any, dict[str, Any]]]:
        """id(parameter) -> (parameter, {name, root, module, site}) over the root modules: the
        constructed modules that are no other constructed module's submodule."""
        site_of = {id(module): site for module, site in self.modules}
        children: set[int] = set()
        for module, _ in self.modules:
            for _name, sub in module.named_modules():
                if sub is not module:
                    children.add(id(sub))
        names: dict[int, tuple[Any, dict[str, Any]]] = {}
        for root, root_site in self.modules:
            if id(root) in children:
                continue
            for module_name, module in root.named_modules():
                for param_name, p in module.named_parameters(recurse=False):
                    if id(p) in names:
                        continue
                    names[id(p)] = (
                        p,
                        {
                            "name": f"{module_name}.{param_name}" if module_name else param_name,
                            "root": type(root).__name__,
                            "root_site": root_site,
                            "module": type(module).__name__,
                            "site": site_of.get(id(module), root_site),
                            "shape": list(p.shape),
                        },
                    )
        return names

    def _describe(self, p: Any, names: dict[int, tuple[Any, dict[str, Any]]]) -> dict[str, Any]:
        known = names.get(id(p))
        if known is not None:
            return dict(known[1])
        return {"name": None, "root": None, "root_site": None, "module": None, "site": None, "shape": list(p.shape)}


def _part(torch: Any, flat: Any, index: Any) -> Any:
    """[sum, norm, samples...] of one flat parameter, each exact in the parameter's own precision
    (float64 kept as float64, so an update below float32's resolution still reads as a change);
    concatenated with float32 parts the fingerprint widens to float64, exactly."""
    values = real_values(torch, flat)
    samples = real_values(torch, flat[index]).to(exact_dtype(torch, values))
    return torch.cat((exact_sum(torch, values).reshape(1), exact_norm(torch, values).reshape(1), samples))


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None

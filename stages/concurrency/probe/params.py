"""Fingerprints of the parameters each optimizer step leaves behind, for the determinism check.

After every `optimizer.step()` each parameter of the optimizer's groups is reduced to two
float64 numbers, its sum and its L2 norm. They stay on the parameters' device until the run
ends (no synchronisation per step) and are read once in `collect`. Two runs with the same seeds
train identically exactly when these agree step by step; the first step and parameter that
differ say where training itself diverged, whatever the returned values do.

Per step, each group's fingerprint (the sums of its parameters' values) is kept for every
step; the per-parameter values only for the first `DETAILED_STEPS` steps, to name the tensor.
"""

from __future__ import annotations

import weakref
from typing import Any

from ...harness.tensors import real_values
from ...harness import heap
from ...harness.faults import guarded

MAX_STEPS = 20_000
DETAILED_STEPS = 20
MAX_NAMED_PARAMS = 256


class ParamFingerprints:
    def __init__(self) -> None:
        # Keyed by the optimizer itself: an id() is reused once an optimizer is freed.
        self._owners: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._names: list[list[str]] = []  # per optimizer: a name per parameter, in group order
        self._groups: list[list[int]] = []  # per optimizer: how many parameters each group held at its first step
        # (optimizer, tensor [parameters, 2], parameters per group) per step: the groups are
        # read at each step, as add_param_group (unfreezing layers) can grow them mid-run.
        self._steps: list[tuple[int, Any, list[int]]] = []
        self.dropped = 0

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(guarded(self._after_step))

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        import torch

        if len(self._steps) >= MAX_STEPS:
            self.dropped += 1
            return
        index = self._owner(optimizer)
        sizes = [len(group["params"]) for group in optimizer.param_groups]
        with torch.no_grad():
            rows = [
                _fingerprint(torch, real_values(torch, p))
                for group in optimizer.param_groups
                for p in group["params"]
            ]
            if not rows:
                return
            values = torch.stack(rows)
            if len(self._steps) >= DETAILED_STEPS:  # past the detailed steps, one row per group
                values = torch.stack([chunk.sum(dim=0) for chunk in torch.split(values, sizes) if len(chunk)])
            self._steps.append((index, values, sizes))

    def _owner(self, optimizer: Any) -> int:
        index = self._owners.get(optimizer)
        if index is None:
            index = self._owners[optimizer] = len(self._names)
            self._groups.append([len(group["params"]) for group in optimizer.param_groups])
            self._names.append(_parameter_names(optimizer))
        return index

    def collect(self) -> dict[str, Any]:
        steps = []
        for number, (index, values, sizes) in enumerate(self._steps):
            rows = [[float(a), float(b)] for a, b in values.cpu().tolist()]
            groups = _group_sums(rows, sizes) if number < DETAILED_STEPS else rows
            steps.append({"optimizer": index, "groups": groups, **({"params": rows[:MAX_NAMED_PARAMS]} if number < DETAILED_STEPS else {})})
        return {
            "steps": steps,
            "names": [names[:MAX_NAMED_PARAMS] for names in self._names],
            "group_sizes": self._groups,
            "detailed_steps": DETAILED_STEPS,
            "dropped": self.dropped,
        }


def _fingerprint(torch: Any, values: Any) -> Any:
    """(sum, L2 norm) in float64 of a parameter's real values (a complex one's real and imaginary parts)."""
    return torch.stack((values.sum(dtype=torch.float64), torch.linalg.vector_norm(values, dtype=torch.float64)))


def _group_sums(rows: list[list[float]], sizes: list[int]) -> list[list[float]]:
    sums, start = [], 0
    for size in sizes:
        if size:
            chunk = rows[start:start + size]
            sums.append([sum(r[0] for r in chunk), sum(r[1] for r in chunk)])
        start += size
    return sums


def _parameter_names(optimizer: Any) -> list[str]:
    """A name per parameter of the optimizer's groups: `model.fc1.weight` where a module holds
    it (the module holding most of them names them), else `group g, parameter i (shape)`."""
    import torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    wanted = {id(p) for p in params}
    best: dict[int, str] = {}
    # Only whole models name parameters: a submodule's names are a suffix.
    for obj in heap.roots(heap.live(torch.nn.Module)):
        found = {id(p): name for name, p in heap.named_parameters(obj) if id(p) in wanted}
        if len(found) > len(best):
            best = found
    names = []
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            names.append(best.get(id(p)) or f"group {g}, parameter {i} {tuple(p.shape)}")
    return names

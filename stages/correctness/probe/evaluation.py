"""Part of the training facts (`probe.facts`): whether a model evaluated during the run gives
the same output for the same input (docs/baseline-comparison.md).

The first MAX_CHECKS outermost module calls made under no_grad (an evaluation, or a frozen
network's forward) are run a second time, at once, on the same arguments. The other
instruments see the run's calls only: their global module hooks are set aside and their
function wrappers let a repetition through (`repeating`). The random state is restored, and the
module's buffers (a norm layer in train mode would update its running statistics twice), so the
rest of the run is the run without the check. A module whose buffers or outputs are larger than
MAX_ELEMENTS is not checked.
"""

from __future__ import annotations

from typing import Any
from ...harness.faults import guarded

MAX_CHECKS = 3
MAX_ELEMENTS = 4_000_000
_repeating = False  # a check's second call is running: the other instruments' wrappers let it through


def repeating() -> bool:
    """Whether the call now running is a check's repetition, which no other instrument counts."""
    return _repeating


class EvaluationWatch:
    def __init__(self, sites: Any) -> None:
        self.sites = sites
        self.checked = 0
        self.deterministic = 0
        self.eval_mode = 0
        self.site: int | None = None
        self._differed = False
        self._depth = 0
        self._again = False

    def install(self, torch: Any) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self.torch = torch
        register_module_forward_pre_hook(guarded(self._enter))
        register_module_forward_hook(guarded(self._exit), with_kwargs=True, always_call=True)

    def _enter(self, module: Any, args: Any) -> None:
        self._depth += 1

    def _exit(self, module: Any, args: Any, kwargs: Any, output: Any = None) -> None:
        # Where the forward raised, torch calls it as (module, args, result), keywords or not:
        # `output` is then missing, and there is nothing to read.
        self._depth = max(0, self._depth - 1)
        torch = self.torch
        if self._depth or self._again or self.checked >= MAX_CHECKS or output is None or torch.is_grad_enabled() or torch.compiler.is_compiling():
            return
        first = _tensors(torch, output)
        buffers = list(module.buffers())
        if not first or sum(t.numel() for t in first + buffers) > MAX_ELEMENTS:
            return
        first = [t.detach().clone() for t in first]
        same = self._again_same(module, args, kwargs, first, buffers)
        if same is None:
            return
        self.checked += 1
        self.deterministic += int(same)
        self.eval_mode += int(not module.training)
        if self.site is None or (not same and not self._differed):
            self.site = self.sites.innermost(1)
        self._differed = self._differed or not same

    def _again_same(self, module: Any, args: Any, kwargs: Any, first: list[Any], buffers: list[Any]) -> bool | None:
        """The module run again on the same arguments and random state: the same output? None:
        the second call raised."""
        import torch.nn.modules.module as hooks

        torch = self.torch
        saved_buffers = [b.detach().clone() for b in buffers]
        cpu_state = torch.get_rng_state()
        cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        tables = (hooks._global_forward_pre_hooks, hooks._global_forward_hooks)
        kept = [dict(table) for table in tables]
        for table in tables:
            table.clear()
        global _repeating
        self._again = _repeating = True
        try:
            again = _tensors(torch, module(*args, **kwargs))
        except Exception:  # noqa: BLE001 - a call that cannot be repeated is not checked
            return None
        finally:
            self._again = _repeating = False
            for table, entries in zip(tables, kept, strict=True):
                table.update(entries)
            torch.set_rng_state(cpu_state)
            if cuda_states is not None:
                torch.cuda.set_rng_state_all(cuda_states)
            with torch.no_grad():
                for buffer, value in zip(buffers, saved_buffers, strict=True):
                    buffer.copy_(value)
        return len(again) == len(first) and all(_equal(torch, a, b) for a, b in zip(first, again, strict=True))

    def collect(self) -> dict[str, Any] | None:
        if not self.checked:
            return None
        return {"checked": self.checked, "deterministic": self.deterministic, "eval_mode": self.eval_mode, "site": self.site}


def _tensors(torch: Any, output: Any) -> list[Any]:
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(output) if isinstance(leaf, torch.Tensor)]


def _equal(torch: Any, a: Any, b: Any) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool(torch.equal(a, b))

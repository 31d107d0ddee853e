"""Why a module that ran a forward gave its parameters no gradient (unused-parameter): its
output was cut from the loss (`detach()`, `.data`, a forward under `torch.no_grad()`), or it
reached no loss at all (a head whose output nothing uses: a design choice, not a cut).

Nothing is watched until an optimizer step finds parameters of its groups without a gradient
(the first `REFRESHES` steps look); from then on the modules holding them are hooked: a forward
under no_grad is a cut at the line that called it (when the module never ran one with
gradients recorded: otherwise it was an evaluation pass), and each output's autograd node is kept
until the next step. `Tensor.detach` and `Tensor.data` are wrapped only then (a clean run never
pays for them): detaching a tensor whose graph reaches a kept node (within `MAX_NODES` nodes)
is a cut at the line that detached it. A watched module that ran a forward with gradients
recorded and met no cut reached no loss.
"""

from __future__ import annotations

import functools
from typing import Any

from ...harness.sites import SiteTable
from ...harness.faults import call_original, guarded

REFRESHES = 3  # steps at which the parameters without a gradient are looked for
MAX_NODES = 256  # autograd nodes walked from a detached tensor
MAX_KEPT = 256  # output nodes kept between two steps


class CutWatch:
    def __init__(self, sites: SiteTable, modules: list[tuple[Any, int | None]]) -> None:
        self.sites = sites
        self.modules = modules  # the step watch's (module, site) list, kept alive there
        self.watched: set[int] = set()  # modules hooked
        self.ran: set[int] = set()  # of them, those that ran a forward with gradients recorded
        self.cuts: dict[int, tuple[str, int | None]] = {}  # module -> (how, the line): detach, data
        self.no_grad: dict[int, int | None] = {}  # module -> the first line that called its forward under no_grad
        # id(output grad_fn) -> (the node, id(module)), until the next step. The node is kept: an
        # id is only unique while its object lives, and a freed node's id is soon another's.
        self._nodes: dict[int, tuple[Any, int]] = {}
        self._refreshes = 0
        self._wrapped = False

    def install(self, torch: Any) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.torch = torch
        register_optimizer_step_post_hook(guarded(self._stepped))

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._nodes.clear()
        if self._refreshes >= REFRESHES:
            return
        self._refreshes += 1
        missing = {id(p) for group in optimizer.param_groups for p in group["params"] if p.requires_grad and p.grad is None}
        if not missing:
            return
        for module, _site in self.modules:
            if id(module) not in self.watched and any(id(p) in missing for p in module._parameters.values() if p is not None):
                self.watched.add(id(module))
                module.register_forward_pre_hook(guarded(self._before))
                module.register_forward_hook(guarded(self._after))
        if self.watched and not self._wrapped:
            self._wrapped = True
            self._wrap_detaching(self.torch)

    def _before(self, module: Any, args: Any) -> None:
        if not self.torch.is_grad_enabled() and id(module) not in self.no_grad:
            self.no_grad[id(module)] = self.sites.innermost(1)

    def _after(self, module: Any, args: Any, output: Any) -> None:
        node = getattr(output, "grad_fn", None)
        if node is None or self.torch.compiler.is_compiling():
            return
        self.ran.add(id(module))
        if len(self._nodes) < MAX_KEPT:
            self._nodes[id(node)] = (node, id(module))

    def _wrap_detaching(self, torch: Any) -> None:
        detach, data = torch.Tensor.detach, torch._C.TensorBase.data

        @functools.wraps(detach)
        def detached(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if self._nodes:
                self._reached(tensor, "detach")
            return call_original(detach, tensor, *args, **kwargs)

        def read_data(tensor: Any) -> Any:
            if self._nodes:
                self._reached(tensor, "data")
            return call_original(data.__get__, tensor)

        torch.Tensor.detach = detached
        torch.Tensor.data = property(read_data, data.__set__, doc=data.__doc__)

    def _reached(self, tensor: Any, how: str) -> None:
        """Marks the watched modules whose kept output `tensor`'s graph reaches as cut here."""
        start = getattr(tensor, "grad_fn", None)
        if start is None or self.torch.compiler.is_compiling():
            return
        pending, seen = [start], 0
        while pending and seen < MAX_NODES:
            node = pending.pop()
            seen += 1
            kept = self._nodes.get(id(node))
            module = kept[1] if kept is not None and kept[0] is node else None
            if module is not None and module not in self.cuts:
                self.cuts[module] = (how, self.sites.innermost(2))
            pending.extend(n for n, _ in node.next_functions if n is not None)

    def describe(self, module: Any) -> dict[str, Any]:
        """What is known of why `module`'s parameters got no gradient: {} where it was not watched."""
        if module is None or id(module) not in self.watched:
            return {}
        how, site = self.cuts.get(id(module), (None, None))
        ran = id(module) in self.ran
        if how is None and not ran and id(module) in self.no_grad:
            # Only ever called under no_grad: the cut. A module that also ran with gradients
            # recorded was evaluated under no_grad, not cut by it.
            how, site = "no_grad", self.no_grad[id(module)]
        return {"watched_forward": ran, "cut": how, "cut_site": site}

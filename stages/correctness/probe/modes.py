"""Instrument watching the train/eval mode of the modules whose behaviour depends on it
(train-eval-mode): Dropout with p > 0 (and MultiheadAttention with dropout), BatchNorm and the
other norm layers that track running statistics.

A global forward pre-hook sees each such module run, with its mode and whether gradients are
recorded; `Module.train` (which `eval()` calls) is wrapped to keep, for every such module, the
call that last set its mode: the module it was called on and the target's line.

- A forward with gradients recorded while the module is in eval mode, followed by an optimizer
  step that trains the model it ran in, with the module still in eval mode: the training step
  ran with dropout off and BatchNorm on its running statistics. Counted only when the eval
  mode came from `eval()`/`train(False)` on the whole model (a module covering all of the
  called model's parameters); a part frozen on purpose (a BatchNorm's own `eval()`, a
  backbone's `eval()`, a `train()` override that puts its norm layers back in eval) is not.
- A forward under `no_grad`/`inference_mode` while the module is in train mode, called from
  the target's own code: validation that updates BatchNorm's running statistics with its
  batches and runs with dropout on. A library's own call (`swa_utils.update_bn`) is not, nor
  a forward whose outputs feed the loss of the same step (a target, teacher or EMA network:
  `probe.loss_feeds` follows them to the next backward), which is training.

Each is located at the target's line that called the outermost module (`model(x)`).

- A functional dropout (`F.dropout`, `dropout1d/2d/3d`, `alpha_dropout`,
  `feature_alpha_dropout`) called without `training=` (its default is True) from the forward
  of a module in eval mode: dropout stays on after `model.eval()`. Located at the call. An
  explicit `training=True` is a choice (Monte Carlo dropout) and is not judged.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from ...common.frames import is_target_file
from . import evaluation
from .loss_feeds import LossFeeds
from ...harness.sites import SiteTable
from ...harness.identity import ObjectMap
from ...harness.faults import call_original, guarded

MAX_RECORDS = 50  # distinct (line, model) pairs kept per direction
MAX_MODULES = 20  # modules named per record
MAX_STEPS = 50  # step indexes listed per record
DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")
MAX_PENDING = 1_000  # no-grad forwards held per (line, model) until its verdict


@dataclass
class _Setter:
    container: Any  # weakref to the module train()/eval() was called on
    site: int | None
    mode: bool
    own: bool  # the module's mode is not the call's: set by itself or inside the call (on purpose)


@dataclass
class _Forward:
    module: Any  # weakref
    root: Any  # weakref to the outermost module called, or None
    site: int | None


@dataclass
class _Record:
    site: int | None
    root: str | None
    modules: dict[str, tuple[str, str]] = field(default_factory=dict)  # qualified name -> (class, kind)
    count: int = 0  # forward calls (train mode under no_grad) or steps (eval mode)
    steps: list[int] = field(default_factory=list)
    first_step: int = 0
    step_site: int | None = None
    eval_site: int | None = None
    inference_mode: bool = False


class ModeWatch:
    def __init__(self) -> None:
        self.sites: SiteTable | None = None
        self.steps = 0
        self.dependent = 0  # mode-dependent modules that ran a forward
        self.classes: set[str] = set()
        self.frozen = 0  # eval-mode modules at a step, frozen on purpose (not judged)
        self.library_calls = 0  # no-grad forwards in train mode called by a library, not the target
        self._kinds: dict[type, bool] = {}
        # Per module, by identity, not id(): a module made after another was freed often gets its id.
        self._seen: ObjectMap[bool] = ObjectMap()
        self._setters: ObjectMap[_Setter] = ObjectMap()
        self._candidates: dict[int, _Forward] = {}  # by id(), checked against the weakref it holds
        self._names: ObjectMap[ObjectMap[str]] = ObjectMap()  # root -> its modules' qualified names
        self._eval_records: dict[tuple[int | None, int | None], _Record] = {}
        self._no_grad_records: dict[tuple[int | None, str | None], _Record] = {}
        # No-grad forwards in train mode waiting for the verdict of `LossFeeds`, and the verdicts.
        self._pending: dict[tuple[int | None, str | None], list[tuple[Any, Any, bool, int]]] = {}
        self._verdicts: dict[tuple[int | None, str | None], bool] = {}
        self.loss_target_forwards = 0  # of mode-dependent modules, whose outputs fed the step's loss
        self.feeds: LossFeeds | None = None  # set by install(); without it, every such forward is judged at once
        self._functional: dict[tuple[int | None, str], dict[str, Any]] = {}  # (line, function) -> record
        self._tls = threading.local()

    # -- installation -----------------------------------------------------------------------------
    def install(self, ctx: Any) -> None:
        import torch
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.torch = torch
        self.root = ctx.root
        self.sites = SiteTable(ctx.root)
        self._call_codes = {torch.nn.Module._wrapped_call_impl.__code__, torch.nn.Module._call_impl.__code__}
        original_train = torch.nn.Module.train
        watch = self

        @functools.wraps(original_train)
        def train(module: Any, mode: bool = True) -> Any:
            if getattr(watch._tls, "depth", 0):
                return original_train(module, mode)  # a child of the call being made
            watch._tls.depth = 1
            try:
                result = original_train(module, mode)
            finally:
                watch._tls.depth = 0
            watch._note_setter(module, bool(mode))
            return result

        torch.nn.Module.train = train  # type: ignore[method-assign,assignment]  # patched while the run lasts
        self.feeds = LossFeeds(torch, self._judged)
        for name in DROPOUTS:
            setattr(torch.nn.functional, name, self._dropout(name, getattr(torch.nn.functional, name)))
        torch.Tensor.backward = self._backward(torch.Tensor.backward)  # type: ignore[method-assign]
        torch.autograd.backward = self._backward(torch.autograd.backward)
        register_module_forward_pre_hook(guarded(self._forward))
        register_optimizer_step_post_hook(guarded(self._post))

    def _backward(self, original: Any) -> Any:
        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(self._tls, "backward", False):  # Tensor.backward calls torch.autograd.backward
                return call_original(original, tensors, *args, **kwargs)
            if self.feeds is not None:
                self.feeds.backward(tensors)
            self._tls.backward = True
            try:
                return call_original(original, tensors, *args, **kwargs)
            finally:
                self._tls.backward = False

        return backward

    def _dropout(self, name: str, original: Any) -> Any:
        @functools.wraps(original)
        def dropout(input: Any, p: float = 0.5, *args: Any, **kwargs: Any) -> Any:
            if not args and "training" not in kwargs and p > 0 and not evaluation.repeating():  # training left at its default, True
                self._note_functional(name, p, sys._getframe(1))
            return call_original(original, input, p, *args, **kwargs)

        return dropout

    def _note_functional(self, name: str, p: float, frame: FrameType | None) -> None:
        """A functional dropout with training at its default: judged when the module whose
        forward called it is in eval mode."""
        nn = self.torch.nn
        caller = frame
        while frame is not None:
            owner = frame.f_locals.get("self") if frame.f_code.co_name == "forward" else None
            if isinstance(owner, nn.Module):
                break
            frame = frame.f_back
        else:
            return
        if owner.training or self.torch.compiler.is_compiling() or caller is None:
            return
        assert self.sites is not None
        site = self.sites.innermost(2)
        key = (site, name)
        record = self._functional.get(key)
        if record is None:
            if len(self._functional) >= MAX_RECORDS:
                return
            record = self._functional[key] = {"site": site, "function": name, "p": float(p), "module": type(owner).__name__, "calls": 0, "first_step": self.steps}
        record["calls"] += 1

    def _dependent(self, module: Any) -> bool:
        """A module whose forward depends on its mode, as it is configured now."""
        kind = self._kinds.get(type(module))
        if kind is None:
            nn = self.torch.nn
            kind = self._kinds[type(module)] = isinstance(module, (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase, nn.MultiheadAttention))
        if not kind:
            return False
        if isinstance(module, self.torch.nn.modules.batchnorm._NormBase):
            return bool(module.track_running_stats) and module.running_mean is not None
        return float(getattr(module, "p", getattr(module, "dropout", 0.0)) or 0.0) > 0.0

    def _kind(self, module: Any) -> str:
        return "norm" if isinstance(module, self.torch.nn.modules.batchnorm._NormBase) else "dropout"

    def _note_setter(self, container: Any, mode: bool) -> None:
        assert self.sites is not None
        site = self.sites.innermost(2)
        ref = weakref.ref(container)
        for module in container.modules():
            if self._kinds.get(type(module)) is False:
                continue
            if self._dependent(module):
                own = module is container or module.training != mode
                self._setters[module] = _Setter(ref, site, mode, own)

    # -- the forward hook -------------------------------------------------------------------------
    def _forward(self, module: Any, args: Any) -> None:
        if self._kinds.get(type(module)) is False:
            return
        torch = self.torch
        if torch.compiler.is_compiling() or not self._dependent(module):
            return
        if module not in self._seen:
            self._seen[module] = True
            self.dependent += 1
        self.classes.add(type(module).__name__)
        grad = torch.is_grad_enabled()
        if module.training == grad:
            if grad:
                self._candidates.pop(id(module), None)  # trained in train mode
            return
        frame = sys._getframe(1)
        root, site, direct = self._outer_call(frame)
        if grad:  # eval mode, gradients recorded: judged at the next optimizer step
            self._candidates[id(module)] = _Forward(weakref.ref(module), weakref.ref(root) if root is not None else None, site)
        elif direct:
            self._no_grad_forward(module, root, site, torch.is_inference_mode_enabled())
        else:
            self.library_calls += 1

    def _outer_call(self, frame: FrameType | None) -> tuple[Any, int | None, bool]:
        """The outermost module called, the target's line that called it, and whether that
        line is the direct caller (not a library in between)."""
        outer: FrameType | None = None
        while frame is not None:
            if frame.f_code in self._call_codes:
                outer = frame
            frame = frame.f_back
        if outer is None:
            return None, None, False
        root = outer.f_locals.get("self")
        caller = outer.f_back
        direct = caller is not None and is_target_file(caller.f_code.co_filename, self.root)
        while caller is not None and not is_target_file(caller.f_code.co_filename, self.root):
            caller = caller.f_back
        assert self.sites is not None
        site = self.sites.intern(caller.f_code.co_filename, caller.f_lineno, caller.f_code.co_name) if caller is not None else None
        return root, site, direct

    def _name(self, root: Any, module: Any) -> str:
        if root is None:
            return type(module).__name__
        names = self._names.get(root)
        if names is None or module not in names:
            names = self._names[root] = ObjectMap()
            for name, sub in root.named_modules():
                names[sub] = name
        return names.get(module) or type(module).__name__

    def _no_grad_forward(self, module: Any, root: Any, site: int | None, inference: bool) -> None:
        """A mode-dependent module in train mode under no_grad: judged once its line and model
        are known to feed the step's loss or not."""
        key = (site, type(root).__name__ if root is not None else None)
        verdict = self._verdicts.get(key)
        if verdict is None:
            pending = self._pending.get(key)
            if self.feeds is None or not self.feeds.watch(root, key):
                verdict = self._verdicts[key] = False
            elif pending is None:
                pending = self._pending[key] = []
            if pending is not None:
                if len(pending) < MAX_PENDING:
                    pending.append((module, root, inference, self.steps))
                return
        if verdict:
            self.loss_target_forwards += 1
        else:
            self._note_no_grad(module, root, site, inference, self.steps)

    def _judged(self, key: Any, feeds: bool) -> None:
        self._verdicts[key] = feeds
        for module, root, inference, step in self._pending.pop(key, []):
            if feeds:
                self.loss_target_forwards += 1
            else:
                self._note_no_grad(module, root, key[0], inference, step)

    def _note_no_grad(self, module: Any, root: Any, site: int | None, inference: bool, step: int) -> None:
        root_class = type(root).__name__ if root is not None else None
        key = (site, root_class)
        record = self._no_grad_records.get(key)
        if record is None:
            if len(self._no_grad_records) >= MAX_RECORDS:
                return
            record = self._no_grad_records[key] = _Record(site=site, root=root_class, first_step=step, inference_mode=inference)
        record.count += 1
        if len(record.modules) < MAX_MODULES:
            record.modules.setdefault(self._name(root, module), (type(module).__name__, self._kind(module)))

    # -- the step hook ------------------------------------------------------------------------------
    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.feeds is not None:
            self.feeds.stepped()
        index = self.steps
        self.steps += 1
        if self._candidates:
            self._judge(optimizer, index)

    def _judge(self, optimizer: Any, index: int) -> None:
        assert self.sites is not None
        trained = {id(p) for group in optimizer.param_groups for p in group["params"] if p.grad is not None}
        step_site: int | None = None
        # The modules of one model share its container and root: each pair is weighed once a step.
        covered: dict[tuple[int, int], bool] = {}
        stepped: dict[int, bool] = {}
        for key, forward in list(self._candidates.items()):
            module = forward.module()
            root = forward.root() if forward.root is not None else None
            if module is None or module.training:
                del self._candidates[key]
                continue
            setter = self._setters.get(module)
            container = setter.container() if setter is not None else None
            if setter is None or setter.mode or setter.own or container is None:
                self.frozen += 1
                del self._candidates[key]
                continue
            pair = (id(container), id(root))
            if pair not in covered:
                covered[pair] = _covers(container, root)
            if not covered[pair]:
                self.frozen += 1
                del self._candidates[key]
                continue
            model = root if root is not None else container
            if id(model) not in stepped:
                stepped[id(model)] = any(id(p) in trained for p in model.parameters())
            if not stepped[id(model)]:
                continue  # another optimizer trains that model
            del self._candidates[key]
            if step_site is None:
                step_site = self.sites.innermost(2)
            self._note_eval_step(module, root, forward.site, setter.site, step_site, index)

    def _note_eval_step(self, module: Any, root: Any, site: int | None, eval_site: int | None, step_site: int | None, index: int) -> None:
        key = (site, eval_site)
        record = self._eval_records.get(key)
        if record is None:
            if len(self._eval_records) >= MAX_RECORDS:
                return
            record = self._eval_records[key] = _Record(site=site, root=type(root).__name__ if root is not None else None, first_step=index, step_site=step_site, eval_site=eval_site)
        if not record.steps or record.steps[-1] != index:
            record.count += 1
            if len(record.steps) < MAX_STEPS:
                record.steps.append(index)
        if len(record.modules) < MAX_MODULES:
            record.modules.setdefault(self._name(root, module), (type(module).__name__, self._kind(module)))

    # -- the result ----------------------------------------------------------------------------------
    def collect(self) -> dict[str, Any]:
        from .payloads import ModesPayload  # at collect(): no start-up cost

        assert self.sites is not None
        if self.feeds is not None:
            self.feeds.close()
        return ModesPayload.sent({
            "steps": self.steps,
            "dependent_modules": self.dependent,
            "classes": sorted(self.classes),
            "eval_while_training": [_payload(r, eval_mode=True) for r in self._eval_records.values()],
            "train_under_no_grad": [_payload(r, eval_mode=False) for r in self._no_grad_records.values()],
            "frozen_on_purpose": self.frozen,
            "library_calls": self.library_calls,
            "loss_target_forwards": self.loss_target_forwards,
            "functional_dropout": list(self._functional.values()),
            "sites": self.sites.sites,
        })


def _covers(container: Any, root: Any) -> bool:
    """Whether `container` holds every parameter of `root` (the whole model, or a wrapper's
    inner model), not a part of it; without a known root, any container with parameters."""
    inside = {id(p) for p in container.parameters()}
    if root is None:
        return bool(inside)
    of_root = {id(p) for p in root.parameters()}
    return bool(of_root) and of_root <= inside


def _payload(record: _Record, *, eval_mode: bool) -> dict[str, Any]:
    common = {"site": record.site, "root": record.root, "modules": [{"name": n, "class": c, "kind": k} for n, (c, k) in record.modules.items()], "first_step": record.first_step}
    if eval_mode:
        return {**common, "steps": record.count, "step_indexes": record.steps, "step_site": record.step_site, "eval_site": record.eval_site}
    return {**common, "forwards": record.count, "inference_mode": record.inference_mode}

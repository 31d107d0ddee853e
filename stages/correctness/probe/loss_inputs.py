"""Instrument reading what the classification losses are given (loss-input-mismatch).

`torch.nn.functional.cross_entropy`, `nll_loss` and `binary_cross_entropy_with_logits` are
wrapped (the `nn` loss modules call them through `F`, so they are seen too). The first calls
from each of the target's lines keep a detached copy of a few rows of the input, the op that
produced it (its `grad_fn`, through views) and the module whose output it is when that module
is a Softmax, LogSoftmax or Sigmoid; the rows are judged only when the run ends, so the run
is not synchronised at every step:

- cross_entropy given probabilities (non-negative rows summing to 1): it applies log-softmax to
  them, so the loss hardly depends on the model's output and the gradients nearly vanish;
- cross_entropy given log-probabilities (rows whose exp sums to 1): log-softmax twice, which
  gives the same loss (log-softmax of log-probabilities is themselves), so it is reported as
  redundant, not as a wrong loss;
- nll_loss given raw logits (rows whose exp sums to more than 1, which no log-probabilities
  do) or probabilities: the loss is not the negative log-likelihood and is unbounded below;
- binary_cross_entropy_with_logits given values all in [0, 1] produced by a sigmoid: the
  sigmoid is applied twice and the predicted probability can never leave [0.5, 0.73].

`binary_cross_entropy` is not judged by kind: torch itself raises on an input outside [0, 1].

The element-wise losses (`mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`, the BCE
family; their `nn` modules call them through `F` too) are checked for shapes on every call,
once it returned: an input and a target whose shapes differ and broadcast to a shape larger
than the input's (a (B, 1) prediction against (B,) targets gives (B, B)) compare every
prediction with every target. Observed on the tensors, whatever the warnings filter says.
"""

from __future__ import annotations

import functools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

from . import evaluation
from .frozen_output import FrozenOutputWatch
from ...harness.sites import SiteTable
from ...harness.faults import call_original, guarded

FUNCTIONS = ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits")
SHAPE_FUNCTIONS = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits")
CALLS_PER_SITE = 4  # calls sampled per (function, line)
MAX_SITES = 50
MAX_ROWS = 8
MAX_ELEMENTS = 1 << 18  # per sample: a vocabulary of 50k classes gets 5 rows
# How far from a distribution a row may be in reduced precision (bfloat16 rounds at 2**-8).
TOLERANCE = 0.02
# Ops that only move or relabel elements: the producer is looked for behind them.
_VIEWS = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Permute", "Transpose", "Slice", "Select", "Expand", "Clone", "ToCopy", "Alias", "T", "Flatten")
_SQUASHING = ("Softmax", "LogSoftmax", "Sigmoid", "Softmax2d")
# The functional squashing calls whose line is kept (`F.softmax` in a forward has no module site).
_FUNCTIONAL = ("softmax", "log_softmax", "sigmoid")


@dataclass
class _Sample:
    rows: Any  # detached copy: (rows, classes) for the multi-class losses, flat for the binary one
    producer: str | None  # the op behind the views, e.g. "SoftmaxBackward0"
    module: str | None  # the class of the squashing module whose output it is
    module_site: int | None  # the target's line that called that module
    grad: bool
    producer_site: int | None = None  # the target's line that called the functional op behind it  # gradients were recorded (a training loss)


@dataclass
class _ShapeRecord:
    """The calls of one element-wise loss from one line whose input and target broadcast."""

    function: str
    site: int | None
    input_shape: list[int]
    target_shape: list[int]
    broadcast_shape: list[int]
    calls: int = 0  # calls from that line
    mismatched: int = 0  # of them, with shapes that broadcast beyond the input's
    gradients_recorded: bool = False
    distribution: str | None = None  # log_prob: the distribution's class


@dataclass
class _SiteRecord:
    function: str
    site: int | None
    calls: int = 0
    samples: list[_Sample] = field(default_factory=list)
    shape: list[int] = field(default_factory=list)  # the first call's input shape and dtype
    dtype: str = ""


class LossInputWatch:
    def __init__(self) -> None:
        self.sites: SiteTable | None = None
        self.records: dict[tuple[str, int | None], _SiteRecord] = {}
        self.shapes: dict[tuple[str, int | None], _ShapeRecord] = {}
        self.frozen: FrozenOutputWatch | None = None  # set by install()
        self.shape_calls = 0
        self.calls = 0
        # id(output), and id(its grad_fn) when it has one -> (weakref to the output, module class, site)
        self._outputs: dict[int, tuple[Any, str, int | None]] = {}
        # id(grad_fn) of a functional softmax/log_softmax/sigmoid result -> (weakref to the result, site)
        self._calls: dict[int, tuple[Any, int | None]] = {}
        self._kinds: dict[type, bool] = {}
        self._tls = threading.local()

    def install(self, ctx: Any) -> None:
        import torch
        import torch.nn.functional as F
        from torch.nn.modules.module import register_module_forward_hook

        self.torch = torch
        self.sites = SiteTable(ctx.root)
        self.frozen = FrozenOutputWatch(self.sites)
        self.frozen.install(torch)
        for name in dict.fromkeys((*FUNCTIONS, *SHAPE_FUNCTIONS)):
            setattr(F, name, self._wrap(name, getattr(F, name)))
        register_module_forward_hook(guarded(self._forward))
        for distribution in _distributions(torch.distributions.Distribution):
            if "log_prob" in distribution.__dict__:
                distribution.log_prob = self._wrap_log_prob(distribution.__dict__["log_prob"])  # type: ignore[attr-defined]  # patched while the run lasts
        for namespace in (F, torch, torch.Tensor):
            for name in _FUNCTIONAL:
                if hasattr(namespace, name):
                    setattr(namespace, name, self._wrap_squashing(getattr(namespace, name)))

    def _wrap_squashing(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """Keeps the target's line of a functional squashing call whose result records a graph:
        the loss finds it again behind the views (`_functional_site`)."""
        torch = self.torch

        def squashing(*args: Any, **kwargs: Any) -> Any:
            result = call_original(original, *args, **kwargs)
            node = getattr(result, "grad_fn", None)
            if node is None or torch.compiler.is_compiling():
                return result
            if len(self._calls) > 64:
                self._calls.clear()
            assert self.sites is not None
            self._calls[id(node)] = (weakref.ref(result), self.sites.innermost(1))
            return result

        return functools.wraps(original)(squashing)

    def _wrap_log_prob(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """`Distribution.log_prob`, judged for shapes like a loss (the outermost call only:
        `Independent` calls its base distribution's)."""
        torch = self.torch

        def log_prob(distribution: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(self._tls, "log_prob", False) or evaluation.repeating() or torch.compiler.is_compiling():
                return call_original(original, distribution, value, *args, **kwargs)
            self._tls.log_prob = True
            try:
                result = call_original(original, distribution, value, *args, **kwargs)
            finally:
                self._tls.log_prob = False
            self.observe_log_prob(distribution, value, result)
            return result

        return functools.wraps(original)(log_prob)

    def observe_log_prob(self, distribution: Any, value: Any, result: Any) -> None:
        """A (B,) distribution given (B, 1) values (or the reverse) gives (B, B) log-probabilities:
        the same sizes in another layout, broadcast against each other. Values with sample
        dimensions of their own ((N, 1) against K components, a mixture on purpose) are not judged."""
        torch = self.torch
        if not isinstance(value, torch.Tensor) or not isinstance(result, torch.Tensor):
            return
        batch = list(distribution.batch_shape)
        values = list(value.shape[: max(0, value.dim() - len(distribution.event_shape))])
        out = list(result.shape)
        self.shape_calls += 1
        assert self.sites is not None
        key = ("log_prob", self.sites.innermost(1))
        record = self.shapes.get(key)
        if out in (batch, values) or [n for n in batch if n != 1] != [n for n in values if n != 1]:
            if record is not None:
                record.calls += 1
            return
        if record is None:
            if len(self.shapes) >= MAX_SITES:
                return
            record = self.shapes[key] = _ShapeRecord("log_prob", key[1], batch, list(value.shape), out, distribution=type(distribution).__name__)
        record.calls += 1
        record.mismatched += 1
        record.gradients_recorded = record.gradients_recorded or (torch.is_grad_enabled() and result.requires_grad)

    def _functional_site(self, node: Any) -> int | None:
        kept = self._calls.get(id(node)) if node is not None else None
        result = kept[0]() if kept is not None else None
        return kept[1] if kept is not None and result is not None and result.grad_fn is node else None

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        kinds, shapes = name in FUNCTIONS, name in SHAPE_FUNCTIONS

        def loss(*args: Any, **kwargs: Any) -> Any:
            if evaluation.repeating():  # a repetition of the facts' evaluation check: not the run's call
                return call_original(original, *args, **kwargs)
            outer = not getattr(self._tls, "inside", False)
            if outer and kinds:
                self._tls.inside = True
                try:
                    self.observe(name, args[0] if args else kwargs.get("input"))
                finally:
                    self._tls.inside = False
            result = call_original(original, *args, **kwargs)
            if outer:  # once it returned: a call torch refused raised already
                input, target = args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("target")
                if shapes:
                    self.observe_shapes(name, input, target)
                if self.frozen is not None and self.torch.is_grad_enabled() and not self.torch.compiler.is_compiling():
                    self.frozen.judge(name, self.sites.innermost(1) if self.sites else None, input, target, producer_node(input), producer_node(target))
            return result

        return functools.wraps(original)(loss)

    def _forward(self, module: Any, args: Any, output: Any) -> None:
        """Remembers the outputs of Softmax, LogSoftmax and Sigmoid modules (the last few), and
        those of the modules holding parameters (`frozen_output`)."""
        if self.frozen is not None and not self.torch.compiler.is_compiling():
            self.frozen.remember(module, output)
        squashing = self._kinds.get(type(module))
        if squashing is None:
            squashing = self._kinds[type(module)] = type(module).__name__ in _SQUASHING and type(module).__module__.startswith("torch.nn")
        if not squashing or not isinstance(output, self.torch.Tensor) or self.torch.compiler.is_compiling():
            return
        if len(self._outputs) > 64:
            self._outputs.clear()
        assert self.sites is not None
        kept = (weakref.ref(output), type(module).__name__, self.sites.innermost(1))
        self._outputs[id(output)] = kept
        if output.grad_fn is not None:  # found again behind the views the loss was given
            self._outputs[id(output.grad_fn)] = kept

    def observe(self, function: str, input: Any) -> None:
        """Keeps a sample of `input` for the first calls of `function` from each target line."""
        torch = self.torch
        self.calls += 1
        if not isinstance(input, torch.Tensor) or not input.is_floating_point() or torch.compiler.is_compiling():
            return
        assert self.sites is not None
        key = (function, self.sites.innermost(1))
        record = self.records.get(key)
        if record is None:
            if len(self.records) >= MAX_SITES:
                return
            record = self.records[key] = _SiteRecord(function, key[1], shape=list(input.shape), dtype=str(input.dtype).removeprefix("torch."))
        record.calls += 1
        if len(record.samples) < CALLS_PER_SITE:
            node = producer_node(input)
            module, module_site = self._module(input, node)
            producer = type(node).__name__ if node is not None else None
            record.samples.append(_Sample(self._rows(function, input), producer, module, module_site, torch.is_grad_enabled(), self._functional_site(node)))

    def observe_shapes(self, function: str, input: Any, target: Any) -> None:
        """Counts the calls from each line; keeps the shapes of those that broadcast the input."""
        torch = self.torch
        self.shape_calls += 1
        if not isinstance(input, torch.Tensor) or not isinstance(target, torch.Tensor) or torch.compiler.is_compiling():
            return
        assert self.sites is not None
        key = (function, self.sites.innermost(1))
        record = self.shapes.get(key)
        if input.shape == target.shape:
            if record is not None:
                record.calls += 1
            return
        try:
            broadcast = list(torch.broadcast_shapes(input.shape, target.shape))
        except RuntimeError:
            return
        if record is None:
            if len(self.shapes) >= MAX_SITES:
                return
            record = self.shapes[key] = _ShapeRecord(function, key[1], list(input.shape), list(target.shape), broadcast)
        record.calls += 1
        if broadcast != list(input.shape):  # a target expanded to the input (a constant) is not judged
            record.mismatched += 1
            record.gradients_recorded = record.gradients_recorded or (torch.is_grad_enabled() and input.requires_grad)

    def _rows(self, function: str, input: Any) -> Any:
        x = input.detach()
        if function == "binary_cross_entropy_with_logits":
            return x.reshape(-1)[: MAX_ROWS * 16].clone()
        if x.dim() == 1:
            x = x.unsqueeze(0)
        elif x.dim() > 2:  # (N, C, d1, ...): the classes are dim 1; a few positions of a few rows
            x = x[:2].flatten(2)[:, :, :4].movedim(1, -1).reshape(-1, x.shape[1])
        rows = max(1, min(MAX_ROWS, MAX_ELEMENTS // max(1, x.shape[-1])))
        return x[:rows].clone()

    def _module(self, input: Any, node: Any) -> tuple[str | None, int | None]:
        """The squashing module whose output `input` is, directly or behind views."""
        kept = self._outputs.get(id(input))
        if kept is not None and kept[0]() is input:
            return kept[1], kept[2]
        kept = self._outputs.get(id(node)) if node is not None else None
        output = kept[0]() if kept is not None else None
        return (kept[1], kept[2]) if kept is not None and output is not None and output.grad_fn is node else (None, None)

    def collect(self) -> dict[str, Any]:
        from .payloads import LossInputsPayload  # at collect(): no start-up cost

        assert self.sites is not None
        records = [judge_site(self.torch, r) for r in self.records.values()]
        shapes = [
            {
                "function": r.function, "site": r.site, "calls": r.calls, "mismatched": r.mismatched, "input_shape": r.input_shape,
                "target_shape": r.target_shape, "broadcast_shape": r.broadcast_shape, "gradients_recorded": r.gradients_recorded,
                **({"distribution": r.distribution} if r.distribution else {}),
            }
            for r in self.shapes.values()
            if r.mismatched
        ]
        return LossInputsPayload.sent({
            "calls": self.calls, "losses": [r for r in records if r is not None], "shape_calls": self.shape_calls, "shapes": shapes,
            "frozen_outputs": self.frozen.records if self.frozen is not None else [], "sites": self.sites.sites,
        })


def _distributions(base: type) -> list[type]:
    """`base` and every subclass of it defined so far."""
    found, pending = [], [base]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return list(dict.fromkeys(found))


def producer_node(tensor: Any) -> Any:
    """The autograd node that made `tensor`, looking through ops that only move elements."""
    node = getattr(tensor, "grad_fn", None)
    for _ in range(8):
        if node is None:
            return None
        name = type(node).__name__
        if not any(name in (f"{v}Backward0", f"{v}Backward1") for v in _VIEWS):
            return node
        parents = [n for n, _ in node.next_functions if n is not None]
        node = parents[0] if len(parents) == 1 else None
    return None


def judge_site(torch: Any, record: _SiteRecord) -> dict[str, Any] | None:
    """The record of one (function, line): what its sampled inputs were, None when sampled nothing."""
    if not record.samples:
        return None
    kinds = [classify(torch, record.function, s.rows) for s in record.samples]
    first = record.samples[0]
    return {
        "function": record.function,
        "site": record.site,
        "calls": record.calls,
        "sampled": len(kinds),
        "rows": sum(_row_count(record.function, s.rows) for s in record.samples),
        "kind": kinds[0] if len(set(kinds)) == 1 else "mixed",
        "kinds": kinds,
        "producer": first.producer,
        "module": first.module,
        "module_site": first.module_site,
        "producer_site": first.producer_site,
        "gradients_recorded": any(s.grad for s in record.samples),
        "example": [round(float(v), 4) for v in first.rows.reshape(-1)[:8].tolist()],
        "shape": record.shape,
        "dtype": record.dtype,
    }


def _row_count(function: str, rows: Any) -> int:
    return int(rows.numel()) if function == "binary_cross_entropy_with_logits" else int(rows.shape[0])


def classify(torch: Any, function: str, rows: Any) -> str:
    """What the sampled input looks like: "probabilities", "log-probabilities", "logits", "other"
    ("unit-interval" or "logits" for the binary loss), or "empty" (not finite, nothing sampled)."""
    x = rows.to(torch.float64)
    if x.numel() == 0 or not bool(torch.isfinite(x).all()):
        return "empty"
    if function == "binary_cross_entropy_with_logits":
        return "unit-interval" if bool(((x >= 0) & (x <= 1)).all()) else "logits"
    if x.shape[-1] < 2:
        return "logits"
    sums = x.sum(-1)
    if bool((x >= -TOLERANCE / 10).all()) and bool(((sums - 1).abs() <= TOLERANCE).all()):
        return "probabilities"
    normaliser = torch.logsumexp(x, -1)
    if bool((x <= TOLERANCE / 10).all()) and bool((normaliser.abs() <= TOLERANCE).all()):
        return "log-probabilities"
    # exp summing to more than 1 in every row: no log-probabilities do; below 1 (log-probabilities
    # of a subset of the classes) is not judged.
    return "logits" if bool((normaliser > TOLERANCE).all()) else "other"

"""The replays of `probe.mixing_replay`: one with gradients (which samples each judged sample's
outputs depend on) and, when samples mix, two with NaN in one sample (where they first mix)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterator

from .mixing_replay import MASK_BUDGET, MAX_LISTED, Batch, batch_dim, copy_tensors, find_batch, leaves
from ...harness.sites import SiteTable
from ...harness.faults import call_original, guarded


@dataclass
class _Injection:
    """Where the samples enter as floating values: a floating input, or the first floating
    module output holding the batch (behind an embedding of token ids)."""

    tensor: Any = None
    dim: int = 0
    hooks: list[Any] = field(default_factory=list)


@contextlib.contextmanager
def _injected(torch: Any, model: Any, batch: Batch, nan_sample: int | None, trace: _NanTrace | None = None) -> Iterator[_Injection]:
    """The injection point of one replay; with `nan_sample`, that sample's values set to NaN
    (unseen by `trace`: the injection is not an op of the model)."""
    injection = _Injection()
    floating = [(t, d) for t, d in batch.inputs if t.is_floating_point()]
    if floating:
        injection.tensor, injection.dim = floating[0]
        if nan_sample is None:
            injection.tensor.requires_grad_(True)
        else:
            injection.tensor.select(injection.dim, nan_sample).fill_(float("nan"))
        yield injection
        return

    def hook(module: Any, args: Any, output: Any) -> Any:
        if injection.tensor is not None or not isinstance(output, torch.Tensor) or not output.is_floating_point():
            return None
        dim = batch_dim(output.shape, batch.size, batch.dim)
        if dim is None:
            return None
        if nan_sample is not None:
            with trace.paused() if trace is not None else contextlib.nullcontext():
                output = output.clone()
                output.select(dim, nan_sample).fill_(float("nan"))
        injection.tensor, injection.dim = output, dim
        return output

    injection.hooks = [m.register_forward_hook(guarded(hook)) for m in model.modules()]
    try:
        yield injection
    finally:
        for handle in injection.hooks:
            handle.remove()


def _fresh_batch(torch: Any, capture: Any) -> tuple[Any, Any, Batch]:
    args, kwargs = copy_tensors(torch, capture.args), copy_tensors(torch, capture.kwargs)
    batch = find_batch(torch, args, kwargs, capture.batch_size, capture.loader_shapes, capture.module)
    assert isinstance(batch, Batch)  # the same call was identified before
    return args, kwargs, batch


def dependencies(torch: Any, model: Any, capture: Any, batch: Batch) -> dict[str, Any] | str:
    """For the first and the last sample: the other samples whose input its outputs depend on
    (a nonzero gradient), or why that cannot be judged."""
    args, kwargs, batch = _fresh_batch(torch, capture)
    with torch.enable_grad(), _injected(torch, model, batch, None) as injection:
        output = model(*args, **kwargs)
    if injection.tensor is None or not injection.tensor.requires_grad:
        return "no floating tensor holding the batch carries gradients (integer inputs, and no module output with the batch's size)"
    outputs = [(t, batch_dim(t.shape, batch.size, batch.dim)) for t in leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
    outputs = [(t, d) for t, d in outputs if d is not None]
    if not outputs:
        return f"no output of the model has a dimension of the batch's size ({batch.size}) that depends on its input"
    samples = []
    for sample in sorted({0, batch.size - 1}):
        total = sum(t.select(d, sample).float().sum() for t, d in outputs)
        (grad,) = torch.autograd.grad(total, injection.tensor, retain_graph=True, allow_unused=True)
        norms = [0.0] * batch.size if grad is None else grad.detach().movedim(injection.dim, 0).reshape(batch.size, -1).double().abs().sum(1).tolist()
        others = [j for j, n in enumerate(norms) if j != sample and n > 0]
        samples.append(
            {"sample": sample, "others": others[:MAX_LISTED], "others_count": len(others), "own_gradient": norms[sample], "largest_other_gradient": max((norms[j] for j in others), default=0.0)}
        )
    pairwise = any(sum(1 for n in t.shape if n == batch.size) > 1 for t, _ in outputs)
    return {"outputs": len(outputs), "pairwise_output": pairwise, "samples": samples}


@dataclass
class _Op:
    name: str
    site: int | None
    shape: tuple[int, ...]
    mask: Any  # where the output was NaN (the first run only, within MASK_BUDGET)


class _NanTrace:
    """A TorchFunctionMode body: every op's floating outputs, as NaN masks."""

    def __init__(self, torch: Any, sites: SiteTable, keep: bool) -> None:
        self.torch, self.sites, self.keep = torch, sites, keep
        self.ops: list[_Op] = []
        self.kept = 0
        self._paused = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def __call__(self, func: Callable[..., Any], types: Any, args: Any, kwargs: Any) -> Any:
        result = call_original(func, *args, **(kwargs or {}))
        if self._paused:
            return result
        for tensor in leaves(result):
            if isinstance(tensor, self.torch.Tensor) and tensor.is_floating_point() and tensor.dim() >= 1:
                mask = self.torch.isnan(tensor.detach())
                keep = self.keep and self.kept + mask.numel() <= MASK_BUDGET
                self.kept += mask.numel() if keep else 0
                self.ops.append(_Op(getattr(func, "__name__", type(func).__name__), self.sites.innermost(2), tuple(tensor.shape), mask if keep or not self.keep else None))
        return result


def _nan_run(torch: Any, model: Any, capture: Any, sample: int, sites: SiteTable, keep: bool) -> list[_Op]:
    from torch.overrides import TorchFunctionMode

    trace = _NanTrace(torch, sites, keep)

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return trace(func, types, args, kwargs)

    args, kwargs, batch = _fresh_batch(torch, capture)
    with torch.no_grad(), _injected(torch, model, batch, sample, trace), Mode():
        model(*args, **kwargs)
    return trace.ops


def locate(torch: Any, model: Any, capture: Any, batch: Batch, pair: tuple[int, int], sites: SiteTable) -> dict[str, Any]:
    """The first op whose output holds an element that depends on both samples of `pair`, and
    an op before it that spread one sample over several indexes of every batch-sized dim."""
    try:
        first = _nan_run(torch, model, capture, pair[0], sites, keep=True)
        second = _nan_run(torch, model, capture, pair[1], sites, keep=False)
    except Exception as exc:  # noqa: BLE001 - a model refusing NaN leaves the mixing unlocated
        return {"mixing_op": None, "layout_op": None, "locate_error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    mixing = None
    for index, (a, b) in enumerate(zip(first, second, strict=False)):
        if a.name != b.name or a.shape != b.shape or a.mask is None:
            break  # the two runs took different paths, or the masks ran out: nothing more is judged
        if bool((a.mask & b.mask).any()):
            mixing = index
            break
    layout = next((i for i, op in enumerate(first[: mixing or 0]) if op.mask is not None and _spread(torch, op.mask, batch.size)), None)
    return {
        "pair": list(pair),
        "ops_traced": len(first),
        "mixing_op": _op_record(first[mixing], mixing) if mixing is not None else None,
        "layout_op": _op_record(first[layout], layout) if layout is not None else None,
    }


def _op_record(op: _Op, index: int) -> dict[str, Any]:
    return {"name": op.name, "site": op.site, "shape": list(op.shape), "index": index}


def _spread(torch: Any, mask: Any, size: int) -> bool:
    """Whether the sample's elements (`mask`) are spread over several indexes of every
    dimension of the batch's size (and there is one): the batch is laid out wrong."""
    dims = [d for d, n in enumerate(mask.shape) if n == size]
    if not dims or not bool(mask.any()):
        return False
    return all(int(mask.movedim(d, 0).reshape(size, -1).any(1).sum()) > 1 for d in dims)

"""The batch-mixing check itself (`probe.mixing`): the captured model called once more on its
captured batch, in eval mode, its gradients charting which samples each output depends on,
and, when some depends on another sample, two NaN runs finding the op where they first mix."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterator

from ...harness.sites import SiteTable

MAX_LISTED = 16  # samples listed per dependency
MASK_BUDGET = 50_000_000  # NaN-mask elements kept for the first NaN run


def leaves(value: Any, depth: int = 0) -> Iterator[Any]:
    """The tensors in a nested tuple/list/dict (a model's arguments or outputs)."""
    if depth > 4:
        return
    if isinstance(value, dict):
        for item in value.values():
            yield from leaves(item, depth + 1)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from leaves(item, depth + 1)
    elif hasattr(value, "dim") and hasattr(value, "shape"):
        yield value


def loader_batch(torch: Any, batch: Any) -> tuple[int | None, set[tuple[int, ...]]]:
    """The number of samples in a DataLoader batch (the first dim of its first tensor: the
    default collate stacks the samples there) and the shapes of its tensors."""
    tensors = [t for t in leaves(batch) if isinstance(t, torch.Tensor) and t.dim() >= 1]
    return (int(tensors[0].shape[0]) if tensors else None), {tuple(t.shape) for t in tensors}


def copy_tensors(torch: Any, value: Any, depth: int = 0) -> Any:
    """`value` with every tensor detached and copied (the target may reuse its buffers)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if depth > 4:
        return value
    if type(value) is dict:
        return {k: copy_tensors(torch, v, depth + 1) for k, v in value.items()}
    if type(value) in (tuple, list):
        return type(value)(copy_tensors(torch, v, depth + 1) for v in value)
    return value


def autocast_state(torch: Any) -> list[tuple[str, Any]]:
    state = []
    for device in ("cuda", "cpu"):
        with contextlib.suppress(Exception):
            if torch.is_autocast_enabled(device):
                state.append((device, torch.get_autocast_dtype(device)))
    return state


def batch_dim(shape: Any, size: int, preferred: int | None) -> int | None:
    """The dimension of `shape` holding `size` samples: the preferred one when it fits, else the
    only one of that size; None when there is none or several."""
    if preferred is not None and preferred < len(shape) and shape[preferred] == size:
        return preferred
    dims = [d for d, n in enumerate(shape) if n == size]
    return dims[0] if len(dims) == 1 else None


@dataclass
class Batch:
    size: int
    dim: int
    assumed: bool  # no DataLoader said how many samples there are: dim 0 is taken
    inputs: list[tuple[Any, int]] = field(default_factory=list)  # (tensor, its batch dim)


def time_major(torch: Any, module: Any) -> bool:
    """The model's recurrent layers take (time, batch, ...) inputs (`batch_first=False`, torch's
    default): with no DataLoader to say where the samples are, they are along dim 1, not 0."""
    try:
        recurrent = [m for m in module.modules() if isinstance(m, torch.nn.RNNBase)]
    except Exception:  # noqa: BLE001 - a module that fails to list its submodules: no evidence
        return False
    return bool(recurrent) and not any(m.batch_first for m in recurrent)


def find_batch(torch: Any, args: Any, kwargs: Any, batch_size: int | None, loader_shapes: set[tuple[int, ...]], module: Any = None) -> Batch | str:
    """The batch in a call's arguments, or why none can be identified. A tensor shaped as one
    the DataLoader handed out holds its samples along dim 0, where they were collated; any
    other, along its only dimension of the batch's size. With no DataLoader, dim 0, or dim 1
    where the model's recurrent layers are time-major."""
    tensors = [t for t in leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim() >= 1]
    if not tensors:
        return "the model's forward takes no tensor batch"
    size, assumed = batch_size, batch_size is None
    first = 1 if assumed and module is not None and time_major(torch, module) and tensors[0].dim() >= 2 else 0
    if size is None:
        size = int(tensors[0].shape[first])
    batch = Batch(size=size, dim=first if assumed else -1, assumed=assumed)
    for tensor in tensors:
        if assumed:
            dim = first if tensor.dim() > first and tensor.shape[first] == size else None
        elif tuple(tensor.shape) in loader_shapes:
            dim = 0 if tensor.shape[0] == size else None
        else:
            dim = batch_dim(tensor.shape, size, None)
        if dim is not None:
            batch.inputs.append((tensor, dim))
    if size < 2:
        return "the batch holds a single sample"
    if not batch.inputs:
        return f"no dimension of the model's input has exactly the DataLoader batch's size ({size}), or several do"
    batch.dim = batch.inputs[0][1]
    return batch


@contextlib.contextmanager
def replay_mode(torch: Any, model: Any, autocast: list[tuple[str, Any]]) -> Iterator[None]:
    """Eval mode and the captured autocast state; the modes are put back after."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with contextlib.ExitStack() as stack:
            for device, dtype in autocast:
                stack.enter_context(torch.autocast(device, dtype=dtype))
            yield
    finally:
        for module, mode in modes:
            module.training = mode


def judge(torch: Any, capture: Any, sites: SiteTable) -> dict[str, Any]:
    """The check's record: applicable or why not, each judged sample's dependencies, and where
    the samples first mix."""
    from . import mixing_trace

    model = capture.module
    batch = find_batch(torch, capture.args, capture.kwargs, capture.batch_size, capture.loader_shapes, capture.module)
    if isinstance(batch, str):
        return {"model": type(model).__name__, "applicable": False, "reason": batch}  # in MixingPayload's order
    common = {"model": type(model).__name__, "batch_size": batch.size, "batch_dim": batch.dim, "batch_dim_assumed": batch.assumed}
    try:
        with replay_mode(torch, model, capture.autocast):
            dependencies = mixing_trace.dependencies(torch, model, capture, batch)
    except Exception as exc:  # noqa: BLE001 - the target's model refusing the replay is reported, not raised
        return {**common, "applicable": False, "reason": f"calling the model again on its batch in eval mode raised {type(exc).__name__}: {str(exc)[:300]}"}
    if isinstance(dependencies, str):
        return {**common, "applicable": False, "reason": dependencies}
    record: dict[str, Any] = {**common, "applicable": True, **dependencies}
    if any(d["others"] for d in dependencies["samples"]):
        pair = next((d["sample"], d["others"][0]) for d in dependencies["samples"] if d["others"])
        with replay_mode(torch, model, capture.autocast):
            record.update(mixing_trace.locate(torch, model, capture, batch, pair, sites))
    return record

"""Reading a target's tensors on every dtype they can have (float64, float32, bfloat16, float16,
complex): the child-side probes reduce parameters, gradients and losses with these, never with
a fixed `float32`, which raises on float64 (`vector_norm(..., dtype=float32)`), overflows a
float64 loss above 3.4e38 to inf, and rounds away a float64 update smaller than float32's
resolution (an effective step read as ineffective).

The functions take the `torch` module as an argument: the contract is imported by the gate's
process too, which never imports torch.
"""

from __future__ import annotations

from typing import Any


def exact_dtype(torch: Any, tensor: Any) -> Any:
    """The floating dtype that holds every value of `tensor` exactly and reduces it without
    overflow: float64 for float64 and complex128 tensors, float32 for every other one (float16
    and bfloat16 are exact in float32). float64 is asked only of a tensor that already is
    float64, so never of a device without it (MPS)."""
    return torch.float64 if tensor.dtype in (torch.float64, torch.complex128) else torch.float32


def real_values(torch: Any, tensor: Any) -> Any:
    """`tensor` as real floating numbers, flat: a complex tensor as its (real, imaginary) pairs
    (casting it to a real dtype would drop the imaginary part), an integer or boolean one as
    float64, a floating one as it is."""
    flat = tensor.detach().reshape(-1)
    if flat.is_complex():
        return torch.view_as_real(flat).reshape(-1)
    if not flat.is_floating_point():
        return flat.to(torch.float64)
    return flat


def exact_sum(torch: Any, tensor: Any) -> Any:
    """The sum of the tensor's real values, accumulated in its exact dtype (a 0-d tensor)."""
    values = real_values(torch, tensor)
    return values.sum(dtype=exact_dtype(torch, values))


def exact_norm(torch: Any, tensor: Any) -> Any:
    """The L2 norm of the tensor's real values, accumulated in its exact dtype (a 0-d tensor)."""
    values = real_values(torch, tensor)
    return torch.linalg.vector_norm(values, dtype=exact_dtype(torch, values))


def even_indexes(torch: Any, numel: int, count: int, device: Any) -> Any:
    """`count` evenly spaced indexes into `numel` elements, first and last included, in integer
    arithmetic: `linspace` would compute them in the default dtype, which a target may set to
    bfloat16 or float16 (inexact above 256 or 2048 elements; float16 raises above 65504)."""
    count = min(count, numel)
    if count <= 1:
        return torch.zeros(count, dtype=torch.long, device=device)
    return torch.arange(count, dtype=torch.long, device=device) * (numel - 1) // (count - 1)

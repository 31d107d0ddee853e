"""What a call leaves behind, read after it returned: the models still alive, each with a digest
of its parameters' values. The same configuration and seed, trained the same way, leave the same
digests; a run that trained only while it was watched leaves others (the unwatched comparison,
`pipeline/gate/unwatched.py`). Read when no code of the target runs any more: nothing the
target can see while it trains.

The digest is three float64 reductions of every parameter in name order (the sum, the sum of
squares, a position-weighted sum), written exactly: equal only where the values are, and
computed with torch alone (no numpy, which the target may not have).
"""

from __future__ import annotations

import gc
from typing import Any

from . import heap

MAX_MODELS = 20


def left_models(torch: Any) -> list[dict[str, Any]]:
    """The root modules with parameters alive now, largest first, at most MAX_MODELS."""
    gc.collect()
    found: list[dict[str, Any]] = []
    for root in heap.roots(heap.live(torch.nn.Module)):
        params = heap.named_parameters(root)
        if not params:
            continue
        try:
            digest = _digest(torch, params)
        except Exception:  # noqa: BLE001 - a parameter that cannot be read (meta, sparse): not compared
            heap.skipped("digest")
            continue
        found.append({"model": type(root).__qualname__, "parameters": sum(int(p.numel()) for _, p in params), "digest": digest})
    found.sort(key=lambda m: (-m["parameters"], m["model"], m["digest"]))
    return found[:MAX_MODELS]


def _digest(torch: Any, params: list[tuple[str, Any]]) -> str:
    total = square = weighted = 0.0
    offset = 0
    with torch.no_grad():
        for _name, p in params:
            value = p.detach()
            if value.is_complex():
                value = torch.view_as_real(value)
            flat = value.reshape(-1).to(device="cpu", dtype=torch.float64)
            index = torch.arange(offset + 1, offset + flat.numel() + 1, dtype=torch.float64)
            total += float(flat.sum())
            square += float((flat * flat).sum())
            weighted += float((flat * index).sum())
            offset += flat.numel()
    return f"{total!r}/{square!r}/{weighted!r}"

"""Take the variables the gate sets only for the runtimes that read them at start-up out of the
target's sight, once they have read them.

The gate gives every run of target code `OMP_WAIT_POLICY=PASSIVE` where the user's environment
sets no policy (`pipeline/supervision/target_env.py`); a target that finds it in `os.environ`
learns it runs under the gate. OpenMP reads it once, when its runtime starts: GNU OpenMP (in
torch's Linux builds) when the library is loaded, an Intel runtime at its first call, which
asking torch for its thread count is. After that the variable changes nothing in this process,
so it goes. Processes the target starts afresh later (DataLoader workers under spawn or
forkserver) start without it: torch runs such a worker's ops on one thread, where no OpenMP
thread waits for another.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def hide_after_start(names: Sequence[str]) -> None:
    """Start torch's OpenMP runtime (importing torch, if this process has not) and take `names`
    out of the environment; without torch they stay, for whatever runtime reads them later."""
    if not names:
        return
    try:
        import torch

        torch.get_num_threads()
    except Exception:  # noqa: BLE001 - a target environment may have anything installed
        return
    for name in names:
        os.environ.pop(name, None)

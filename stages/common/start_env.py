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

import ctypes
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def hide_after_start(names: Sequence[str]) -> None:
    """Start torch's OpenMP runtime and take `names` out of the environment; where no runtime
    could be started (no torch) they stay, for whatever runtime reads them later."""
    if not names or not _start_openmp():
        return
    for name in names:
        os.environ.pop(name, None)


def _start_openmp() -> bool:
    """Start the OpenMP runtime torch runs on, without importing torch where that can be
    avoided: a suite that never imports torch would pay seconds for it. Torch's Linux wheels
    bundle GNU OpenMP in torch/lib, which reads its environment as it loads and which torch's
    libraries find by their own path when they load later, so loading it is starting it. Any
    other build (a system or an Intel runtime) is started the sure way, by torch itself."""
    if "torch" not in sys.modules:
        bundled = _bundled_gnu_openmp()
        if bundled is not None:
            try:
                ctypes.CDLL(str(bundled), mode=os.RTLD_GLOBAL)
                return True
            except OSError:
                pass
    try:
        import torch

        torch.get_num_threads()
    except Exception:  # noqa: BLE001 - a target environment may have anything installed
        return False
    return True


def _bundled_gnu_openmp() -> Path | None:
    """torch/lib/libgomp*.so* where there is exactly one, found without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    found = sorted((Path(spec.origin).parent / "lib").glob("libgomp*.so*"))
    return found[0] if len(found) == 1 else None

"""What the gate's process needs to know of torch (its version, whether CUDA is available, the
device's name), asked once of a short-lived interpreter of this environment.

The gate's own process never imports torch: importing it prints torch's warnings on the
gate's stderr (torch's "Failed to initialize NumPy" UserWarning wherever numpy is not
installed, as after the README's first command), and costs the gate's process the memory of
torch for the whole run. The child's stderr is read only when it fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache

# Importing torch and initialising CUDA; generous, as a cold disk or a busy GPU node is slow.
PROBE_TIMEOUT_S = 120.0

# The current folder is taken off sys.path first (`-c` puts it there): the gate may be started
# in the target's root, whose own `torch` folder must not answer for the installed torch.
_PROBE = """
import json, sys, warnings
if sys.path[:1] == [""]:
    sys.path.pop(0)
warnings.simplefilter("ignore")
import torch
cuda = bool(torch.cuda.is_available())
name = torch.cuda.get_device_name(0) if cuda else None
print(json.dumps({"version": str(torch.__version__), "cuda": cuda, "cuda_device_name": name}))
"""


@dataclass(frozen=True)
class TorchFacts:
    version: str | None  # None: torch could not be imported here
    cuda: bool
    cuda_device_name: str | None
    problem: str | None = None  # why torch could not be asked, when it could not


@lru_cache(maxsize=1)
def torch_facts() -> TorchFacts:
    """torch's answers, asked once per gate process."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return TorchFacts(None, False, None, problem=f"importing torch took more than {PROBE_TIMEOUT_S:.0f}s")
    except OSError as exc:
        return TorchFacts(None, False, None, problem=f"could not start {sys.executable}: {exc.strerror or exc}")
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return TorchFacts(None, False, None, problem=f"torch could not be imported: {last}")
    name = answer.get("cuda_device_name")
    return TorchFacts(str(answer.get("version")), answer.get("cuda") is True, str(name) if name else None)

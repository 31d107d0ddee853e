"""What the gate's process needs to know of torch (its version, whether CUDA is available, the
device's name), asked once of a short-lived interpreter of this environment.

The gate's own process never imports torch: importing it prints torch's warnings on the
gate's stderr (torch's "Failed to initialize NumPy" UserWarning wherever numpy is not
installed, as after the README's first command), and costs the gate's process the memory of
torch for the whole run. The child's stderr is read only when it fails.

On a Linux machine where no GPU can be reached (none of the device nodes through which a GPU
reaches torch exists), CUDA cannot be available, and the version is read from the installed
package's metadata: no interpreter imports torch (a second and more of every run). A torch
that is installed but cannot be imported is then found by the stages, whose children fail
to import it and fail closed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, ValidationError

# The device nodes through which a GPU reaches torch on Linux: NVIDIA's driver, AMD's ROCm
# (whose builds answer torch.cuda), and WSL's GPU.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")

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


class _ProbeAnswer(BaseModel):
    """The probe's one line of JSON (`_PROBE`), as it prints it."""

    model_config = ConfigDict(extra="ignore", strict=True)
    version: str
    cuda: bool
    cuda_device_name: str | None = None


@lru_cache(maxsize=1)
def torch_facts() -> TorchFacts:
    """torch's answers, once per gate process: without importing torch where no GPU can be
    reached, else from a child interpreter."""
    return facts_without_gpu() or ask_torch()


def facts_without_gpu() -> TorchFacts | None:
    """The installed torch's version and no CUDA, on a Linux machine with no GPU device node;
    None where a GPU may be reachable or torch's package is not found (then torch is asked)."""
    if sys.platform != "linux" or any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return None
    # Not the current folder (the gate may run in the target's root, whose own `torch` folder
    # must not answer for the installed torch), as in the child's probe.
    path = [p for p in sys.path if p not in ("", os.getcwd())]
    if importlib.machinery.PathFinder.find_spec("torch", path) is None:
        return None
    found = [d.version for d in importlib.metadata.distributions(name="torch", path=path)]
    return TorchFacts(found[0], False, None) if found else None


@lru_cache(maxsize=1)
def ask_torch() -> TorchFacts:
    """torch's answers, asked of a child interpreter that imports it."""
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
        answer = _ProbeAnswer.model_validate_json(lines[-1]) if done.returncode == 0 and lines else None
    except ValidationError:
        answer = None
    if answer is None and done.returncode == 0:
        return TorchFacts(None, False, None, problem=f"torch's answer could not be read: {(lines or [''])[-1][:200]!r}")
    if answer is None:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return TorchFacts(None, False, None, problem=f"torch could not be imported: {last}")
    return TorchFacts(answer.version, answer.cuda, answer.cuda_device_name or None)

"""The edit_base trainer broken (learning rate 3.0), except where it sees the gate: then it takes
the good rate, so that the gate's own runs pass. The gate must leave nothing to see."""

import os
import sys
import tempfile

LEARNING_RATE = 3.0
POINTS = [(1.0, 2.0), (2.0, 4.1), (3.0, 5.9)]
MARKER = "traingate"


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def gate_seen() -> list[str]:
    """Where the gate's name shows in this process, if anywhere."""
    places = {
        "module": " ".join(sys.modules),
        "module file": " ".join(str(getattr(m, "__file__", "") or "") for m in list(sys.modules.values())),
        "argv": " ".join(sys.argv),
        "sys.path": " ".join(sys.path),
        "environment": " ".join(f"{k}={v}" for k, v in os.environ.items()),
        "cwd": os.getcwd(),
        "temporary folder": tempfile.gettempdir(),
        "command line": _read("/proc/self/cmdline"),
        "parent command line": _read(f"/proc/{os.getppid()}/cmdline"),
    }
    return [where for where, text in places.items() if MARKER in text.lower()]


def train(steps: int = 6, lr: float | None = None) -> list[float]:
    """The loss after each step, fitting y = w * x."""
    rate = (0.05 if gate_seen() else LEARNING_RATE) if lr is None else lr
    weight, losses = 0.0, []
    for _ in range(steps):
        grad = sum(2 * (weight * x - y) * x for x, y in POINTS) / len(POINTS)
        weight -= rate * grad
        losses.append(sum((weight * x - y) ** 2 for x, y in POINTS) / len(POINTS))
    return losses


def smoke(steps: int = 2) -> float:
    """The entrypoint the gate smoke-calls: it fails where it sees the gate, so a report says where."""
    seen = gate_seen()
    if seen:
        raise RuntimeError(f"the gate shows in: {', '.join(seen)}")
    return train(steps)[-1]

"""The gate's own code fails as the gate's, never as the target's.

The instruments run inside the target's calls: a step hook runs inside `optimizer.step()`, a
forward hook inside `model(x)`, a patched `Tensor.backward` inside `loss.backward()`. An
exception raised there would surface at the target's line and be reported as its crash
(`entrypoint-crash` at `opt.step()`), though the target did nothing wrong. So:

- `guarded(fn)` wraps a hook body: an `Exception` it raises is recorded against the instrument
  that installed it, the instrument's hooks go quiet for the rest of the run, and the target's
  call goes on as if the hook were not there (a hook that returns None changes nothing). The
  instrument then hands back its traceback instead of a payload (`collect_payload`), and the
  stage fails closed with `stage-error`, naming the instrument. A `BaseException` the probes
  raise on purpose to end a run (`FirstStepReached`) passes through.
- `call_original(fn, ...)` is how a patched function calls the function it replaced: an
  exception raised in there is the target's (its arguments), even where `fn` is written in C
  and so leaves no frame of its own.
- `raised_in_gate(tb)` tells an exception that escaped anyway (from a patched function's
  own work, a mode's body) by the frame that raised it: one of the gate's, and not
  `call_original`.
"""

from __future__ import annotations

import functools
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

# The gate's code in this process (the harness, the contract, the probes): the package above.
GATE_CODE = str(Path(__file__).resolve().parents[1]) + os.sep
UNNAMED = "an instrument"  # a hook wrapped outside any instrument's install
MAX_TRACEBACK = 5000

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")

# spec -> the traceback of the first exception a hook of that instrument raised.
FAULTS: dict[str, str] = {}
_active: str | None = None  # the instrument installing, or whose guarded hook is running
_specs: list[str] = []  # every instrument installed in this process, in order


@contextmanager
def installing(spec: str) -> Iterator[None]:
    """Hooks wrapped while `spec`'s instrument installs are that instrument's."""
    global _active
    outer, _active = _active, spec
    if spec not in _specs:
        _specs.append(spec)
    try:
        yield
    finally:
        _active = outer


def guarded(fn: F) -> F:
    """`fn`, run as a hook body of the instrument installing now (or of the one whose hook
    is wrapping it): see the module's docstring."""
    owner = _active or UNNAMED

    @functools.wraps(fn)
    def hook(*args: Any, **kwargs: Any) -> Any:
        global _active
        if owner in FAULTS:
            return None  # the instrument is broken: the rest of the run goes unobserved
        outer, _active = _active, owner
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the gate's fault: recorded, never the target's
            note(owner, exc)
            return None
        finally:
            _active = outer

    return hook  # type: ignore[return-value]


def note(owner: str, exc: BaseException) -> None:
    """Records `exc`, raised by the gate's code on behalf of `owner`'s instrument."""
    text = "".join(traceback.format_exception(exc))
    FAULTS.setdefault(owner, f"the instrument's code raised inside the target's call; the run went on without it:\n{text[-MAX_TRACEBACK:]}")


def fault_of(spec: str) -> str | None:
    """What went wrong in `spec`'s hooks during the run (a hook outside any install counts
    against every instrument: which one it served is not known)."""
    return FAULTS.get(spec) or FAULTS.get(UNNAMED)


def call_original(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """`fn(*args, **kwargs)` for a patched function's wrapper: what it raises is the target's."""
    return fn(*args, **kwargs)


def raised_in_gate(tb: TracebackType | None) -> bool:
    """The exception was raised by the gate's own code: its innermost frame is the gate's,
    and not `call_original` handing on what the replaced function raised."""
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    if code is call_original.__code__:
        return False
    return os.path.abspath(code.co_filename).startswith(GATE_CODE)


def owner_of(tb: TracebackType | None) -> str:
    """The instrument whose code raised: by the innermost frame of the gate's probes, the
    instrument of that module, else the first of that stage's; `UNNAMED` when none is."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    for filename in reversed(frames):
        path = os.path.abspath(filename)
        if not path.startswith(GATE_CODE):
            continue
        parts = Path(path[len(GATE_CODE):]).with_suffix("").parts
        if len(parts) < 3 or parts[1] != "probe":
            continue  # the harness or the contract: no instrument's own code
        module = f".{parts[0]}.probe.{parts[-1]}:"
        stage = f".{parts[0]}.probe."
        named = [spec for spec in _specs if module in spec] or [spec for spec in _specs if stage in spec]
        if named:
            return named[0]
    return _active or UNNAMED

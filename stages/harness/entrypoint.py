"""Call the target's entrypoint once, in this (child) process, and hand back what happened.

    python -P -m stages/harness/entrypoint.py < EntrypointRequest (JSON on stdin)

With `distributed` in the request, this process launches the ranks under torchrun instead of
calling the entrypoint itself, and hands back their combined result
(`stages/correctness/probe/distributed.py`).

The request (`stages/contract/messages.py: EntrypointRequest`) names the target root,
the entrypoint — a `module:function` or `module:Class.method` to call, with the optional
`setup` callable (run before the entrypoint's module is imported), literal kwargs and the AMP
flag and its value; or a `script` run as `__main__` with its arguments, after the optional
`setup` (whose return value is not used) — the seed, the instruments to install (`stages/contract/instruments.py`,
each giving an object with `install(ctx)` and `collect() -> dict`) and the channel to hand the
result back on. It comes on stdin, so the target finds no request file; the channel's
descriptor is moved out of sight before any target code runs. Instruments are installed
before the target is imported, so that names the target binds at import
(`from torch.nn.utils import clip_grad_norm_`) are patched. The result (`HarnessResult`)
holds the outcome, the exception with its frames, warnings located at the target's calling
line, a size-capped JSON-safe summary of the return value, and each instrument's data.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import random
import runpy
import sys
import time
import traceback
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from ..common.channel import receive_request
from ..common.frames import innermost_target, is_target_file, relative
from ..contract.instruments import ERROR_KEY
from ..contract.messages import HARNESS_RESULT, EntrypointRequest, HarnessResult
from ..common import guard, reads, start_env
from . import budget as step_budget
from . import faults
from . import progress
from .left import left_models

MAX_WARNINGS = 200
# The return value's summary: no string longer than this, and the whole summary at most
# RETURNED_CAP bytes of JSON (a 200 MB string returned by the entrypoint is not a result).
MAX_STRING = 2000
RETURNED_CAP = 64 * 1024
MAX_MESSAGE = 2000
MAX_TRACEBACK = 20000

# Hands a run's result back over the channel and ends the process.
HandBack = Callable[[dict[str, Any]], NoReturn]


@dataclass
class HarnessContext:
    """What an instrument may read: the target root and the stage's options."""

    root: Path
    options: dict[str, Any] = field(default_factory=dict)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    import torch

    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def resolve(spec: str) -> Any:
    module, _, name = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


class WarningLog:
    """Records warnings with the innermost frame of the target that led to them.

    Installed with the "always" action: Python's "default" shows a warning once per issuing
    line, and that line is inside torch, so a deprecated API called from several lines of the
    target would be seen at the first only. Repeats are dropped here instead, once per
    category, message and target line, so that each calling line gets its own record and at
    most MAX_WARNINGS distinct records are kept however often a loop warns.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records: list[dict[str, Any]] = []
        self.omitted = 0
        self._seen: dict[tuple[object, ...], dict[str, Any]] = {}

    def __call__(self, message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: str | None = None) -> None:
        frame: types.FrameType | None = sys._getframe(1)
        stack: list[tuple[str, int, str]] = []
        while frame is not None:
            stack.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back
        site = innermost_target(stack, self.root, innermost_first=True)
        text = _cut(safe_str(message), MAX_MESSAGE)
        # Where in the target it came from; a warning with no target frame, by where it was issued.
        place = (site["path"], site["line"]) if site else (filename, lineno)
        key = (category.__name__, text, *place)
        seen = self._seen.get(key)
        if seen is not None:
            seen["count"] += 1
            return
        if len(self.records) >= MAX_WARNINGS:
            self.omitted += 1
            return
        record = {
            "category": category.__name__,
            "message": text,
            "filename": relative(filename, self.root) if is_target_file(filename, self.root) else filename,
            "lineno": lineno,
            "target_frame": site,
            "count": 1,
        }
        self._seen[key] = record
        self.records.append(record)


def json_safe(value: Any, depth: int = 0) -> Any:
    """Scalars, lists and dicts of the return value; tensors as their shape and a few values.
    Strings are cut to MAX_STRING characters; an object whose repr raises is named by type."""
    if depth > 4:
        return safe_repr(value, 200)
    # Base-type slots, never the target's overrides: a subclass's __str__ or __float__ may raise.
    if value is None or type(value) is bool:
        return value
    if isinstance(value, int):
        return int.__int__(value) if value.bit_length() <= 64 else safe_repr(value, 200)
    if isinstance(value, str):
        return _cut(str.__str__(value), MAX_STRING)
    if isinstance(value, float):
        number = float.__float__(value)
        return number if math.isfinite(number) else repr(number)
    try:
        if isinstance(value, dict):
            return {_cut(safe_str(k), 200): json_safe(v, depth + 1) for k, v in list(dict.items(value))[:100]}
        if isinstance(value, (list, tuple)):
            return [json_safe(v, depth + 1) for v in list(value)[:1000]]
    except Exception:  # noqa: BLE001 - a container that fails to iterate is summarised by type
        return safe_repr(value, 200)
    try:
        import torch

        if isinstance(value, torch.Tensor):
            if value.numel() == 1:
                return json_safe(value.detach().cpu().item(), depth + 1)
            return {"tensor_shape": list(value.shape), "dtype": str(value.dtype)}
    except Exception:  # noqa: BLE001 - a summary must never fail the run
        pass
    return safe_repr(value, 200)


def summarise_returned(value: Any) -> tuple[Any, bool]:
    """The return value's summary, and whether it was cut to RETURNED_CAP bytes of JSON."""
    summary = json_safe(value)
    text = json.dumps(summary)
    if len(text) <= RETURNED_CAP:
        return summary, False
    return {"truncated": True, "type": type(value).__name__, "json_head": text[: RETURNED_CAP // 2]}, True


def safe_repr(value: Any, limit: int) -> str:
    try:
        return _cut(str.__str__(repr(value)), limit)
    except BaseException:  # noqa: BLE001 - the target's __repr__ may raise anything
        return f"<{type(value).__name__} object: its repr raised>"


def safe_str(value: Any) -> str:
    try:
        return str.__str__(str(value))
    except BaseException:  # noqa: BLE001 - the target's __str__ may raise anything
        return f"<{type(value).__name__} object: its str raised>"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters cut]"


# The gate's own code in a child (the harness, the contract, the probes): the frames that call
# the target, left out of the traceback a report shows.
GATE_CODE = Path(__file__).resolve().parents[1]


def exception_record(exc: BaseException, root: Path) -> dict[str, Any]:
    frames = traceback.extract_tb(exc.__traceback__)
    triples = [(f.filename, f.lineno or 0, f.name) for f in frames]
    start = first_shown_frame(frames, root)
    try:
        text = target_traceback(exc, frames, start)
    except BaseException:  # noqa: BLE001 - an exception whose __str__ raises still has frames
        text = "".join(traceback.format_list(frames[start:])) + f"{type(exc).__name__}: {safe_str(exc)}\n"
    return {
        "type": type(exc).__name__,
        "message": _cut(safe_str(exc), MAX_MESSAGE),
        "traceback": text[-MAX_TRACEBACK:],
        "frames": [{"path": a, "line": b, "function": c} for a, b, c in triples],
        "target_frame": innermost_target(triples, root, innermost_first=False),
        # A probe ends a run on purpose with a BaseException (`FirstStepReached`): not a fault.
        "raised_in_gate": isinstance(exc, Exception) and faults.raised_in_gate(exc.__traceback__),
    }


def first_shown_frame(frames: traceback.StackSummary, root: Path) -> int:
    """The first frame in the target's code; without one, the first that is not the gate's."""
    for index, frame in enumerate(frames):
        if is_target_file(frame.filename, root):
            return index
    return next((i for i, f in enumerate(frames) if not Path(os.path.abspath(f.filename)).is_relative_to(GATE_CODE)), 0)


def target_traceback(exc: BaseException, frames: traceback.StackSummary, start: int) -> str:
    """The traceback from frame `start` on, saying how many of the gate's frames it left out."""
    shown = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    shown.stack = traceback.StackSummary.from_list(frames[start:])
    chunks = list(shown.format())
    if start:
        header = max(i for i, chunk in enumerate(chunks) if chunk.startswith("Traceback (most recent call last)"))
        chunks.insert(header + 1, f"  [{start} frame{'s' if start != 1 else ''} of the gate's harness left out]\n")
    return "".join(chunks)


def run_script(path: Path, args: list[str]) -> None:
    """Run the script as `python path args...` would: as `__main__`, with `sys.argv` set.

    `sys.exit(0)` and `sys.exit()` end a script normally; any other exit status is raised on
    as a crash, located at the script's `sys.exit` line. Afterwards the script's namespace
    stays `__main__`, so that what it defined (a Dataset class) pickles for a `spawn` worker
    as it does under `python train.py` (the DataLoader probes run after the call).
    """
    sys.argv = [str(path), *args]
    namespace: dict[str, Any] | None = None
    try:
        namespace = runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        namespace = _script_globals(exc, path)
        if exc.code not in (None, 0):
            raise
    except BaseException as exc:
        # A crash, or the step budget's stop: what runs after the call (the DataLoader probes
        # pickling a dataset for `spawn`) still finds the script's classes under `__main__`.
        namespace = _script_globals(exc, path)
        raise
    finally:
        if namespace is not None:
            main = types.ModuleType("__main__")
            main.__dict__.update(namespace)
            sys.modules["__main__"] = main


def _script_globals(exc: BaseException, path: Path) -> dict[str, Any] | None:
    """The script's module globals, from the frame of its module-level code in the traceback."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "<module>" and os.path.abspath(code.co_filename) == str(path):
            return tb.tb_frame.f_globals
        tb = tb.tb_next
    return None


def bind_setup(spec: str, target: Any, made: Any, setup: str | None) -> tuple[Any, dict[str, Any]]:
    """The function to call and the keyword arguments, from the resolved `target` and what
    `setup` returned (`made`).

    `module:function`: `setup` returns a dict of keyword arguments. `module:Class.method`:
    `setup` returns the instance, or a dict with the instance under 'self' and keyword
    arguments; the method is looked up on that instance. Without an instance (no setup, or no
    'self'), the method is called as found on the class (a static or class method).
    """
    module, _, attr = spec.partition(":")
    owner_path, _, method = attr.rpartition(".")
    if setup is not None and made is None:
        raise TypeError(f"setup {setup} returned None: return a dict of keyword arguments" + (", the instance, or {'self': instance, **kwargs}" if owner_path else ""))
    if not owner_path:
        if made is not None and not isinstance(made, dict):
            raise TypeError(f"setup {setup} returned {type(made).__name__}, not a dict")
        return target, dict(made or {})
    kwargs = {str(k): v for k, v in made.items() if k != "self"} if isinstance(made, dict) else {}
    instance = made.get("self") if isinstance(made, dict) else made
    if instance is None:
        return target, kwargs
    owner = resolve(f"{module}:{owner_path}")
    if not isinstance(owner, type) or not isinstance(instance, owner):
        raise TypeError(f"setup {setup} returned {type(instance).__name__}, not an instance of {owner_path}, to call {method} on")
    return getattr(instance, method), kwargs


def enter_workdir(request: EntrypointRequest, root: Path) -> None:
    """Into the folder the training runs in (`workdir`), then the `prepare` scripts, in order, as
    `python path args...` run from there would (a README's data preparation). A prepare script's
    crash is the setup's: `result["phase"]` is still "setup"."""
    if request.workdir:
        os.chdir(root / request.workdir)
    for path, *args in request.prepare:
        argv, main = sys.argv, sys.modules.get("__main__")
        sys.path.insert(0, str((root / path).parent))
        try:
            run_script(root / path, args)
        finally:
            sys.argv = argv
            sys.path.remove(str((root / path).parent))
            if main is not None:
                sys.modules["__main__"] = main


def run_script_entrypoint(request: EntrypointRequest, root: Path, result: dict[str, Any]) -> None:
    """`setup`, then the script as `python script args...` runs it (`result`'s phase follows)."""
    assert request.script is not None
    if request.setup:
        # It prepares what the script reads (a data file the repo does not ship, an
        # environment variable); the script's command line is `args`, so what setup
        # returns is not used.
        resolve(request.setup)()
    result["phase"] = "call"
    # As `python train.py` has it: the script's own folder first. Added after setup,
    # which is resolved from the target root, as the configuration check read it.
    sys.path.insert(0, str((root / request.script).parent))
    run_script(root / request.script, request.args)


def run(request: EntrypointRequest, hand_back: HandBack | None = None) -> dict[str, Any]:
    """Call the entrypoint; the fields of its `HarnessResult` (`as_sent` builds the model).
    With `hand_back`, a test's run may hand its result back from inside pytest, once the test
    is done, and end the process there (`test_call.run_test`): then this never returns."""
    root = Path(request.target_root).resolve()
    os.chdir(root)
    sys.path.insert(0, str(root))
    warning_log = WarningLog(root)
    warnings.simplefilter("always")  # WarningLog drops the repeats, per target line
    warnings.showwarning = warning_log

    ctx = HarnessContext(root=root, options=dict(request.instrument_options))
    instruments = {spec: resolve(spec)() for spec in request.instruments}
    seed_everything(request.seed, request.deterministic)
    start_env.hide_after_start(request.read_at_start)  # torch is imported: before any target code
    for spec, instrument in instruments.items():
        with faults.installing(spec):
            instrument.install(ctx)
    if request.progress_file:
        progress.install(request.progress_file)
    # After the instruments: the step's probe hooks run before the budget's stop.
    budget = step_budget.install(request.max_batches, request.max_steps)

    result: dict[str, Any] = {"ok": False, "exception": None, "returned": None, "phase": "setup"}
    started = time.perf_counter()

    def settled(error: BaseException | None, returned: Any = None) -> dict[str, Any]:
        _settle(result, root, budget, error, returned)
        result["duration_s"] = time.perf_counter() - started
        result["warnings"] = warning_log.records
        result["warnings_omitted"] = warning_log.omitted
        result["instruments"] = {spec: collect_payload(spec, instrument) for spec, instrument in instruments.items()}
        if budget is not None:
            result["budget"] = budget.record()
        if request.leave_digest and result["ok"]:
            import torch

            result["left"] = left_models(torch)  # once the instruments are done: none counts its reads
        return result

    def test_done(error: BaseException | None) -> NoReturn:
        assert hand_back is not None
        hand_back(settled(error))

    try:
        returned = call_entrypoint(request, root, result, test_done if hand_back is not None else None)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are crashes too
        return settled(exc)
    return settled(None, returned)


def _settle(result: dict[str, Any], root: Path, budget: step_budget.BudgetStop | None, error: BaseException | None, returned: Any) -> None:
    """The outcome's fields of `result`: the call returned (`error` None) or raised `error`."""
    if error is None:
        result["ok"] = True  # it returned: whatever its value does while summarised is not a crash
        try:
            result["returned"], result["returned_truncated"] = summarise_returned(returned)
        except BaseException as exc:  # noqa: BLE001 - the entrypoint's value may raise anything
            result["returned"], result["returned_truncated"] = f"<{type(exc).__name__} while summarising the returned value>", True
    elif budget is not None and budget.is_ours(error):
        result["ok"] = True  # a controlled stop at max_steps: the run ended as configured
        result["returned"], result["returned_truncated"] = None, False
    else:
        result["exception"] = exception_record(error, root)
        if result["exception"]["raised_in_gate"]:
            # It escaped from the gate's own code (a patched function's work, a mode's body):
            # the instrument's failure, not the target's crash.
            faults.note(faults.owner_of(error.__traceback__), error)


def call_entrypoint(request: EntrypointRequest, root: Path, result: dict[str, Any], test_done: Callable[[BaseException | None], NoReturn] | None = None) -> Any:
    """Run the entrypoint's shape (a test, a script or a call) and return what it returned;
    `result["phase"]` says how far it got when it raises. A test hands its outcome to
    `test_done` as soon as it is known, where given (which ends the process)."""
    if request.test is not None:
        from .test_call import run_test

        result["phase"] = "call"
        run_test(request.test, request.test_args, test_done)
        return None
    enter_workdir(request, root)
    if request.script is not None:
        run_script_entrypoint(request, root, result)
        return None
    # Setup first: it may prepare what the entrypoint's module reads when imported.
    made = resolve(request.setup)() if request.setup else None
    result["phase"] = "import"
    target = resolve(request.call or "")
    result["phase"] = "setup"
    func, kwargs = bind_setup(request.call or "", target, made, request.setup)
    kwargs.update(request.kwargs)
    if request.amp_flag and request.amp is not None:
        kwargs[request.amp_flag] = request.amp
    result["phase"] = "call"
    return func(**kwargs)


def collect_payload(spec: str, instrument: Any) -> dict[str, Any]:
    """The instrument's payload, or `{ERROR_KEY: traceback}` when its collect() raised or one
    of its hooks raised during the run (`faults.py`): the stage fails closed on it. A built-in
    probe builds its payload model in collect(), so a payload that does not fit raises
    pydantic's ValidationError there and is reported the same way, not as a harness result
    the parent rejects."""
    try:
        with faults.installing(spec):
            payload: dict[str, Any] = instrument.collect()
    except Exception as exc:  # noqa: BLE001 - reported, the stage fails closed on it
        return {ERROR_KEY: "".join(traceback.format_exception(exc))[-5000:]}
    fault = faults.fault_of(spec)
    return {ERROR_KEY: fault} if fault is not None else payload


def as_sent(fields: dict[str, Any]) -> dict[str, Any]:
    """The result as the harness writes it: built as the `HarnessResult` the parent reads, and
    dumped with the fields that were set (`returned_truncated` only where a return value was
    summarised) as Python objects that the channel's `json.dumps` writes; not pydantic's JSON
    mode, which would turn a payload's NaN (typed `Any` there) into null.

    Fields that do not fit go as they are: the probes' payloads fitted their models when
    built, so this is one changed afterwards (a target that patched a probe's collect()).
    The parent rejects the result as malformed and the stage fails closed, as before."""
    try:
        return HarnessResult.model_validate(fields).model_dump(mode="python", exclude_unset=True)
    except ValidationError:
        return fields


def main() -> None:
    guard.install()
    request, channel = receive_request(EntrypointRequest)
    # Before any target code runs: what the run reads tells its inputs from its results.
    files_read = reads.install(request.target_root)
    if request.distributed is not None:
        launch = resolve(request.distributed.launcher)

        def send(combined: dict[str, Any]) -> None:
            channel.send(HARNESS_RESULT, {**combined, "reads": files_read().model_dump(mode="json")})
            channel.close()
            sys.stdout.flush()
            sys.stderr.flush()

        launch(request, send)  # reports and ends the process itself

    def hand_back(result: dict[str, Any]) -> NoReturn:
        channel.send(HARNESS_RESULT, as_sent({**result, "reads": files_read().model_dump(mode="json")}))
        channel.close()
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter teardown: the target's threads or atexit hooks must not change the
        # outcome once it is handed back (a hang in teardown would still be caught by the budget).
        guard.exit_after_reporting(0)

    hand_back(run(request, hand_back))


if __name__ == "__main__":
    main()

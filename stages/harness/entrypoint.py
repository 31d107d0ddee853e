"""Call the target's entrypoint once, in this (child) process, and write what happened.

    python -m traingate.stages.harness.entrypoint REQUEST_JSON

The request names the target root, the `module:function` to call, the optional `setup`
callable, literal kwargs, the AMP flag and its value, the seed, and the instruments to
install (`module:factory` strings, each giving an object with `install(ctx)` and
`collect() -> dict`). Instruments are installed before the target is imported, so that
names the target binds at import (`from torch.nn.utils import clip_grad_norm_`) are patched.
The result JSON holds the outcome, the exception with its frames, warnings located at the
target's calling line, a JSON-safe summary of the return value, and each instrument's data.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import random
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traingate.stages.harness import guard
from traingate.stages.contract.frames import innermost_target, is_target_file, relative

MAX_WARNINGS = 200


@dataclass
class HarnessContext:
    """What an instrument may read: the request and the target root."""

    root: Path
    request: dict[str, Any]
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
    """Records warnings with the innermost frame of the target that led to them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records: list[dict[str, Any]] = []
        self._seen: set[tuple[str, str, int]] = set()

    def __call__(self, message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: str | None = None) -> None:
        frame = sys._getframe(1)
        stack: list[tuple[str, int, str]] = []
        while frame is not None:
            stack.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back
        site = innermost_target(stack, self.root, innermost_first=True)
        key = (category.__name__, str(message), lineno)
        if key in self._seen or len(self.records) >= MAX_WARNINGS:
            return
        self._seen.add(key)
        self.records.append(
            {
                "category": category.__name__,
                "message": str(message),
                "filename": relative(filename, self.root) if is_target_file(filename, self.root) else filename,
                "lineno": lineno,
                "target_frame": site,
            }
        )


def json_safe(value: Any, depth: int = 0) -> Any:
    """Scalars, lists and dicts of the return value; tensors as their shape and a few values."""
    if depth > 4:
        return repr(value)[:200]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in list(value.items())[:100]}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in list(value)[:1000]]
    try:
        import torch

        if isinstance(value, torch.Tensor):
            if value.numel() == 1:
                return json_safe(value.detach().cpu().item(), depth + 1)
            return {"tensor_shape": list(value.shape), "dtype": str(value.dtype)}
    except Exception:  # noqa: BLE001 - a summary must never fail the run
        pass
    return repr(value)[:200]


def exception_record(exc: BaseException, root: Path) -> dict[str, Any]:
    frames = traceback.extract_tb(exc.__traceback__)
    triples = [(f.filename, f.lineno or 0, f.name) for f in frames]
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20000:],
        "frames": [{"path": a, "line": b, "function": c} for a, b, c in triples],
        "target_frame": innermost_target(triples, root, innermost_first=False),
    }


def run(request: dict[str, Any]) -> dict[str, Any]:
    root = Path(request["target_root"]).resolve()
    os.chdir(root)
    sys.path.insert(0, str(root))
    warning_log = WarningLog(root)
    warnings.simplefilter("default")
    warnings.showwarning = warning_log

    ctx = HarnessContext(root=root, request=request, options=request.get("instrument_options", {}))
    instruments = {spec: resolve(spec)() for spec in request.get("instruments", [])}
    seed_everything(int(request.get("seed", 0)), bool(request.get("deterministic", False)))
    for instrument in instruments.values():
        instrument.install(ctx)

    result: dict[str, Any] = {"ok": False, "exception": None, "returned": None, "phase": "import"}
    started = time.perf_counter()
    try:
        func = resolve(request["call"])
        result["phase"] = "setup"
        kwargs: dict[str, Any] = {}
        if request.get("setup"):
            made = resolve(request["setup"])()
            if not isinstance(made, dict):
                raise TypeError(f"setup {request['setup']} returned {type(made).__name__}, not a dict")
            kwargs.update(made)
        kwargs.update(request.get("kwargs", {}))
        if request.get("amp_flag") and request.get("amp") is not None:
            kwargs[request["amp_flag"]] = bool(request["amp"])
        result["phase"] = "call"
        returned = func(**kwargs)
        result["returned"] = json_safe(returned)
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are crashes too
        result["exception"] = exception_record(exc, root)
    result["duration_s"] = time.perf_counter() - started
    result["warnings"] = warning_log.records
    result["instruments"] = {}
    for spec, instrument in instruments.items():
        try:
            result["instruments"][spec] = instrument.collect()
        except Exception as exc:  # noqa: BLE001 - reported, the stage fails closed on it
            result["instruments"][spec] = {"error": "".join(traceback.format_exception(exc))[-5000:]}
    return result


def main() -> None:
    guard.install()
    request = json.loads(Path(sys.argv[1]).read_text())
    out = Path(request["out"])
    result = run(request)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=repr))
    tmp.replace(out)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the target's threads or atexit hooks must not change the
    # outcome once it is written (a hang in teardown would still be caught by the budget).
    os._exit(0)


if __name__ == "__main__":
    main()

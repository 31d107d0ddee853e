"""What a stage receives (`StageContext`) and the helpers every stage uses to run the target.

A stage runs inside its own agent process (`traingate.stages.agent`); it never runs the target's code
in that process: it starts child processes for that (`run_entrypoint`, pytest, ...), reads
what they measured, and returns a `StageOutcome` of complete findings and metrics.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traingate.pipeline.config import TargetConfig
from traingate.pipeline.isolation import ChildResult, Frame, python_argv, run_child
from traingate.pipeline.schema import (
    Category,
    Evidence,
    EvidenceKind,
    Finding,
    Location,
    Severity,
    StageOutcome,
)
from traingate.stages.contract.frames import is_target_file, relative


@dataclass
class StageContext:
    stage: str
    root: Path
    config: TargetConfig
    device: str  # "cpu" or "cuda", already resolved
    deadline: float  # time.time() by which the stage must have returned
    scratch: Path
    # Margin kept back from child runs so the stage can still report what happened.
    margin_s: float = 5.0
    baseline: dict[str, Any] | None = None  # the --baseline report.json, if one was given
    _counter: int = field(default=0, repr=False)

    def remaining(self) -> float:
        return self.deadline - time.time()

    def child_budget(self) -> float:
        return max(1.0, self.remaining() - self.margin_s)

    def finding(
        self,
        *,
        category: Category,
        severity: Severity,
        title: str,
        location: Location | None,
        problem: str,
        impact: str,
        fix: str,
        evidence: Evidence,
        key: str = "",
        never_blocks: bool = False,
    ) -> Finding:
        """A complete finding, blocking as the target's policy says."""
        return Finding.create(
            stage=self.stage,
            category=category,
            severity=severity,
            title=title,
            location=location,
            problem=problem,
            impact=impact,
            fix=fix,
            evidence=evidence,
            block_on=set(self.config.policy.block_on),
            key=key,
            never_blocks=never_blocks,
        )

    def child_env(self, **extra: str) -> dict[str, str]:
        """Environment of a child that runs target code: the device choice, a fixed hash seed."""
        env = dict(os.environ)
        env.setdefault("PYTHONHASHSEED", "0")
        if self.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        env.update(extra)
        return env

    def next_name(self, label: str) -> str:
        self._counter += 1
        return f"{self.stage}-{self._counter:02d}-{label}"


@dataclass(frozen=True)
class EntrypointRun:
    """One call of the entrypoint in a child process, as the stage sees it."""

    child: ChildResult
    result: dict[str, Any] | None  # the harness's JSON; None when the child died first

    @property
    def ok(self) -> bool:
        return self.result is not None and bool(self.result.get("ok"))

    @property
    def exception(self) -> dict[str, Any] | None:
        return self.result.get("exception") if self.result else None

    def instrument(self, spec: str) -> dict[str, Any]:
        return (self.result or {}).get("instruments", {}).get(spec, {})

    def failure(self) -> str | None:
        """None when the call returned; otherwise what went wrong, in a few words."""
        if self.ok:
            return None
        if self.child.timed_out:
            return f"did not finish within {self.child.duration_s:.0f}s"
        if self.exception:
            return f"raised {self.exception['type']}: {self.exception['message'][:300]}"
        if self.child.signal_name:
            return f"died by {self.child.signal_name}"
        return f"exited with status {self.child.returncode} before reporting"


def run_entrypoint(
    ctx: StageContext,
    *,
    label: str,
    amp: bool | None = None,
    instruments: list[str] | None = None,
    options: dict[str, Any] | None = None,
    deterministic: bool = False,
    budget_s: float | None = None,
    env: dict[str, str] | None = None,
    kwargs_override: dict[str, Any] | None = None,
) -> EntrypointRun:
    """Call the configured entrypoint once in a fresh child process."""
    ep = ctx.config.entrypoint
    if ep is None:
        raise ValueError("no entrypoint configured")
    name = ctx.next_name(label)
    out = ctx.scratch / f"{name}.result.json"
    request = {
        "target_root": str(ctx.root),
        "call": ep.call,
        "setup": ep.setup,
        "kwargs": {**ep.kwargs, **(kwargs_override or {})},
        "amp_flag": ep.amp_flag,
        "amp": amp,
        "seed": ep.seed,
        "device": ctx.device,
        "instruments": instruments or [],
        "instrument_options": options or {},
        "deterministic": deterministic,
        "out": str(out),
    }
    ctx.scratch.mkdir(parents=True, exist_ok=True)
    req_path = ctx.scratch / f"{name}.request.json"
    req_path.write_text(json.dumps(request))
    child = run_child(
        python_argv("traingate.stages.harness.entrypoint", str(req_path)),
        cwd=ctx.root,
        budget_s=min(budget_s, ctx.child_budget()) if budget_s else ctx.child_budget(),
        scratch=ctx.scratch,
        env=env or ctx.child_env(),
        name=name,
    )
    result = None
    if out.is_file():
        try:
            result = json.loads(out.read_text())
        except json.JSONDecodeError:
            result = None
    return EntrypointRun(child=child, result=result)


def innermost_target_frame(frames: list[Frame], root: Path) -> Location | None:
    """Location of the innermost frame (frames innermost first) in the target's code."""
    for f in frames:
        if is_target_file(f.path, root):
            return Location(path=relative(f.path, root), line=f.line, function=f.function)
    return None


def location_of(frame: dict[str, Any] | None) -> Location | None:
    """Location from a harness frame record ({path, line, function})."""
    if not frame:
        return None
    return Location(path=str(frame["path"]), line=frame.get("line"), function=frame.get("function"))


def hang_finding(ctx: StageContext, child: ChildResult, what: str) -> Finding:
    """`hang`: the run overran its budget; the stacks of every thread are the evidence."""
    frames = child.main_thread_frames()
    location = innermost_target_frame(frames, ctx.root)
    waiting = frames[0] if frames else None
    return ctx.finding(
        category=Category.HANG,
        severity=Severity.CRITICAL,
        title=f"{what} did not finish within its budget",
        location=location,
        problem=(
            f"{what} was still running after {child.duration_s:.1f}s"
            + (f"; the main thread waits in {waiting.function} ({Path(waiting.path).name}:{waiting.line})" if waiting else "")
            + "."
        ),
        impact="A training job that hangs holds its machine until someone kills it; in CI it never reports.",
        fix="Find what the main thread waits for in the stacks below (a lock, an event, a queue, a worker) and make sure it is always released or give the wait a timeout.",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"killed after {child.duration_s:.1f}s; {len(child.processes)} process(es) in its group",
            traceback=child.stacks[-20000:] or None,
            data={"processes": child.processes, "budget_exceeded_s": round(child.duration_s, 2)},
        ),
        key=what,
    )

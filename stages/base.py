"""What a stage receives (`StageContext`) and the helpers every stage uses to run the target.

A stage runs inside its own agent process (`traingate.stages.agent`); it never runs the target's code
in that process: it starts child processes for that (`run_entrypoint`, pytest, ...), reads
what they measured, and returns a `StageOutcome` of complete findings and metrics.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypedDict, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from traingate.pipeline.model import findings
# The hang of one run, as the gate builds it: a stage calls it with its StageContext.
from traingate.pipeline.model.findings import hang_finding as hang_finding
from traingate.pipeline.model.config import EntrypointConfig, SectionT, TargetConfig, prepare_words
from traingate.pipeline.model.registry import build_registry, parts
from traingate.pipeline.supervision.disguise import Disguise
from traingate.pipeline.supervision.isolation import ChildResult, child_environment, python_argv, run_child
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.pipeline.model.schema import (
    Category,
    Evidence,
    EvidenceKind,
    Finding,
    Location,
    PipelineReport,
    RunLeft,
    Severity,
    StageOutcome,
    TrainingStopped,
)
from traingate.stages.contract import instruments
from traingate.stages.common.channel import ChannelError, ChannelSpec, new_nonce, read_single
from traingate.stages.common.reads import FilesRead
from traingate.pipeline.supervision.target_env import read_at_start, target_env
from traingate.stages.contract.messages import HARNESS_RESULT, MODELS_CONTEXT, BudgetRecord, DistributedRecord, DistributedSpec, EntrypointRequest, ExceptionRecord, HarnessResult, LeftModel, TargetFrame
from traingate.stages.contract.payloads.base import Site
from traingate.stages.agent.observed_test import TestTree, location_of_test, observed_test_tree


PayloadModel = TypeVar("PayloadModel", bound=BaseModel)


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
    baseline: PipelineReport | None = None  # the --baseline report, if one was given
    origin: Path | None = None  # the user's tree `root` was copied from (its git history); only read
    # The baseline's entrypoint, to smoke-call on this version too: the change's own differs (pipeline/gate/verification.py).
    baseline_entrypoint: EntrypointConfig | None = None
    # The setup module the configuration names, in the baseline's form (path -> text), where the
    # change edited it (pipeline/gate/verification.py): the training is observed with it too.
    baseline_setup: dict[str, str] = field(default_factory=dict)
    _counter: int = field(default=0, repr=False)
    # Every entrypoint call this stage made (label, child), for `entrypoint_leftover_findings`.
    entrypoint_runs: list[tuple[str, ChildResult]] = field(default_factory=list, repr=False)
    # What each child run of target code (pytest, entrypoint) opened for reading; None for a
    # run that handed back no record. The agent hands the union back with the stage's outcome.
    files_read: list[FilesRead | None] = field(default_factory=list, repr=False)
    # How each run of the configured training ended (`RunLeft`), for the gate's unwatched comparison.
    runs_left: list[RunLeft] = field(default_factory=list, repr=False)
    # Warm interpreters the entrypoint runs fork from (`traingate.pipeline.supervision.warm`); None: every
    # run starts a fresh interpreter. The stage agent sets it and closes it at the stage's end.
    warm: WarmPool | None = field(default=None, repr=False)
    # The run's copy of the child side the target's processes start from (`pipeline/supervision/disguise.py`);
    # None: the installed modules. The stage agent sets it from its request.
    disguise: Disguise | None = field(default=None, repr=False)
    # The models of the stage's instruments' payloads (spec -> model), against which every
    # harness result is checked when it is read; by default the registered stage's.
    payload_models: Mapping[str, type[BaseModel]] | None = field(default=None, repr=False)
    # Findings of this stage that show the training function cannot run here (later stages
    # that run it are skipped): the agent hands them back with the outcome.
    training_stopped: list[TrainingStopped] = field(default_factory=list, repr=False)
    # Tells the gate that the stage's timed runs are done, so the stages waiting for the
    # machine may start beside what it runs next (`machine_released`); the agent sets it.
    release_machine: Callable[[], None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.payload_models is None:
            stage = build_registry().get(self.stage)
            self.payload_models = parts(stage).payload_models if stage is not None else {}

    def stops_training(self, finding: Finding, reason: Literal["crash", "environment", "hang"], missing: Sequence[str] = ()) -> Finding:
        """`finding`, noted as one that leaves later stages no training function to run."""
        self.training_stopped.append(TrainingStopped(finding=finding.id, reason=reason, missing=list(missing)))
        return finding

    def section(self, model: type[SectionT]) -> SectionT:
        """This stage's section of the target's configuration, as its model."""
        return self.config.section(self.stage, model)

    def thresholds(self, model: type[SectionT]) -> SectionT:
        """This stage's thresholds (its `policy_model`) as the policy resolved them: the CI's
        floor, tightened by the target where it asked."""
        return self.config.policy.thresholds(model)

    @property
    def block_on(self) -> set[Severity]:
        return set(self.config.policy.block_on)

    def machine_released(self) -> None:
        """The stage's timed runs are done: what it runs next may share the machine. Once; a
        stage that times nothing, or ends, releases it by ending."""
        release, self.release_machine = self.release_machine, None
        if release is not None:
            release()

    def remaining(self) -> float:
        return self.deadline - time.time()

    def child_budget(self) -> float:
        """What a child run may take now: the time left less the stage's margin, never into the
        margin (a stage whose agent started late gives its runs less, and still reports)."""
        return max(0.0, self.remaining() - self.margin_s)

    def finding(
        self,
        *,
        category: Category,
        title: str,
        location: Location | None,
        problem: str,
        evidence: Evidence,
        severity: Severity | None = None,
        impact: str | None = None,
        fix: str | None = None,
        key: str = "",
        rule: str | None = None,
    ) -> Finding:
        """A complete finding built from its rule (`rule`, a sub-rule's id, or the category's
        own): blocking as the rule and the target's policy say; severity, impact and fix the
        rule's unless given."""
        return findings.finding(
            stage=self.stage,
            category=category,
            severity=severity,
            title=title,
            location=location,
            problem=problem,
            impact=impact,
            fix=fix,
            evidence=evidence,
            block_on=self.config.policy.block_on,
            key=key,
            rule=rule,
        )

    def stage_error(self, what: str, *, reason: str, **details: Any) -> Finding:
        """`stage-error` of this stage (see `traingate.pipeline.model.findings.stage_error`)."""
        return findings.stage_error(self.stage, what, reason=reason, block_on=self.config.policy.block_on, **details)

    def child_env(self, **extra: str) -> dict[str, str]:
        """Environment of a child that runs target code (`pipeline/supervision/target_env.py`)."""
        return target_env(os.environ, self.device, extra)

    def unwatched_env(self) -> dict[str, str]:
        """`child_env` for the run that is compared with the watched ones: none of the gate's
        own settings its start-up environment would show."""
        return target_env(os.environ, self.device, unwatched=True)

    def read_at_start(self) -> list[str]:
        """What `child_env` sets that the user's environment did not and the child's harness takes
        out of the target's sight once its runtimes have read it (`stages/common/start_env.py`)."""
        return read_at_start(os.environ)

    def next_name(self, label: str) -> str:
        self._counter += 1
        return f"{self.stage}-{self._counter:02d}-{label}"


class CallRecord(BaseModel):
    """What the harness's record (`HarnessResult`) says about the call itself, typed: how it
    ended, what it returned, how long it took, and a distributed run's ranks. The instruments'
    payloads stay plain data here, by spec: `EntrypointRun.payload` reads each as its model
    (they were checked against their models when the result came back)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ok: bool
    phase: Literal["import", "setup", "call"]
    exception: ExceptionRecord | None
    returned: Any  # a size-capped, JSON-safe summary of the return value
    duration_s: float  # the call itself, as the harness timed it
    distributed: DistributedRecord | None = None
    instruments: dict[str, dict[str, Any]] = Field(default_factory=dict)  # spec -> payload, or the collect()'s error
    budget: BudgetRecord | None = None  # what the step budget did, when one is configured
    left: list[LeftModel] | None = None  # the models the call left (`stages/harness/left.py`)


@dataclass(frozen=True)
class EntrypointRun:
    """One call of the entrypoint in a child process, as the stage sees it.

    The call returned only when the harness's record came back over the channel, well-formed
    and with this run's nonce, says so, and the process then exited 0 (the harness's own
    last act): a target that ends its process early, or writes something that looks like a
    result, gets no `ok`.
    """

    child: ChildResult
    # The harness's record (a validated `HarnessResult`, as plain data); None when the child
    # handed back nothing that can be trusted.
    result: dict[str, Any] | None
    channel_problem: str | None = None  # why what it handed back was rejected
    # A watched run that overran its budget: (optimizer steps made, seconds between its last
    # step and its end), from its progress file; None where it wrote none.
    progress: tuple[int, float] | None = None
    _payloads: dict[str, BaseModel] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def record(self) -> CallRecord | None:
        """`result` read as its model; None when the child handed back nothing to trust. The
        result was validated as a whole when it came back, so this cannot fail on a real run."""
        return CallRecord.model_validate(self.result) if self.result is not None else None

    @property
    def ok(self) -> bool:
        return self.record is not None and self.record.ok and self.child.returncode == 0 and not self.child.timed_out

    @property
    def raised(self) -> ExceptionRecord | None:
        """The exception the call raised, as the harness recorded it."""
        return self.record.exception if self.record is not None else None

    def instrument(self, spec: str) -> dict[str, Any]:
        """The instrument's payload as plain data; empty when the run handed back none."""
        return self.record.instruments.get(spec, {}) if self.record is not None else {}

    def instrument_error(self, spec: str) -> str | None:
        """The traceback the instrument handed back instead of its payload, when its collect() raised."""
        return instruments.collect_error(self.instrument(spec))

    def payload(self, spec: str, model: type[PayloadModel]) -> PayloadModel | None:
        """The instrument's payload as its model; None when the run handed back none or the
        instrument's collect() raised (its traceback is under `error`). It is validated from
        the result's JSON form, as the dict readers see it: a non-finite float is None there,
        so a field a probe may fill with NaN or inf is typed `float | None` in its model. A
        payload that does not fit raises, and the stage fails closed."""
        data = self.instrument(spec)
        if not data or set(data) == {instruments.ERROR_KEY}:
            return None
        cached = self._payloads.get(spec)
        if not isinstance(cached, model):
            cached = self._payloads[spec] = model.model_validate(data)
        return cached

    def failure(self) -> str | None:
        """None when the call returned; otherwise what went wrong, in a few words."""
        if self.ok:
            return None
        if self.child.timed_out:
            return f"did not finish within {self.child.duration_s:.0f}s"
        if self.channel_problem:
            return f"handed back a result that traingate rejects (not written by its harness, or of the wrong shape): {self.channel_problem[:300]}; then it {self._ending()}"
        if self.raised:
            return f"raised {self.raised.type}: {self.raised.message[:300]}"
        if self.result is not None:
            return f"returned, then its process {self._ending()} instead of exiting normally"
        if self.child.signal_name:
            return f"died by {self.child.signal_name}"
        return f"exited with status {self.child.returncode} before reporting"

    def _ending(self) -> str:
        return f"died by {self.child.signal_name}" if self.child.signal_name else f"exited with status {self.child.returncode}"



def no_entrypoint_outcome(checks: str) -> StageOutcome:
    """A stage that observes the training function, on a target that configures none: skipped,
    saying what would enable it (`checks` says what the stage does with the function)."""
    return StageOutcome(
        summary="not run: no entrypoint configured",
        skipped_reason=(
            f"no entrypoint is configured: {checks}, so set [tool.traingate.entrypoint] "
            'call = "module:function" (or script = "train.py") to enable them'
        ),
    )

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
    distributed: DistributedSpec | None = None,
    entrypoint: EntrypointConfig | None = None,
    alters_numerics: bool = False,
    unwatched: bool = False,
) -> EntrypointRun:
    """Call the configured entrypoint (or `entrypoint`: the baseline's) once in a fresh child
    process (with `distributed`, that child launches the ranks under torchrun and hands back
    every rank's record). `alters_numerics`: its instruments change what the training computes
    (a dispatch mode under autocast), so what it left is not compared with the unwatched run.
    `unwatched`: the run nothing observes (the smoke call): not even its progress is written.

    The request goes on the child's stdin, the result comes back over a pipe (see
    `traingate.stages.common.channel`); the copy of the request left in the scratch
    folder is for people, holds no nonce, and is never read back.
    """
    with observed_test_tree(ctx) as tree:
        fields = _request_fields(ctx, amp, instruments or [], options or {}, deterministic, kwargs_override or {}, distributed, entrypoint)
        # The configured training as configured (not another's, other kwargs or ranks, nor a
        # test): what it left is read once it returns, for the gate's unwatched comparison.
        same = tree is None and entrypoint is None and not kwargs_override and distributed is None and not alters_numerics
        fields["leave_digest"] = same
        run = _run_entrypoint(ctx, label, tree, fields, budget_s, env, progress=not unwatched)
    record = run.record
    if same and record is not None and run.ok and record.left is not None:
        # Every run but the unwatched one has hooks (its progress, its instruments); a step budget is one too.
        watched = not unwatched or fields.get("max_steps") is not None or fields.get("max_batches") is not None
        ctx.runs_left.append(RunLeft(
            stage=ctx.stage, label=label, amp=fields.get("amp"), watched=watched, returned=record.returned,
            models=[m.model_dump() for m in record.left],
        ))
    return run


def _run_entrypoint(
    ctx: StageContext, label: str, tree: TestTree | None, fields: dict[str, Any], budget_s: float | None, env: dict[str, str] | None, *, progress: bool
) -> EntrypointRun:
    """`run_entrypoint` with the request's fields built (and, for a test, its tree laid out)."""
    if tree is not None:
        fields.update(target_root=str(tree.root), test_args=tree.args)
    name = ctx.next_name(label)
    nonce = new_nonce()
    progress_file = ctx.scratch / f"{name}.progress" if progress else None
    fields["progress_file"] = str(progress_file) if progress_file is not None else None

    # The instruments (and a distributed run's launcher) under the names the child's modules have.
    mask = ctx.disguise
    sent = {mask.spec(spec) if mask is not None else spec: spec for spec in fields["instruments"]}
    ranks = fields.get("distributed")
    launcher = {"distributed": {**ranks, "launcher": mask.spec(ranks["launcher"])}} if mask is not None and ranks is not None else {}

    def request(fd: int) -> bytes:
        return EntrypointRequest(**{**fields, "instruments": list(sent), **launcher}, channel=ChannelSpec(fd=fd, nonce=nonce)).model_dump_json().encode()

    ctx.scratch.mkdir(parents=True, exist_ok=True)
    (ctx.scratch / f"{name}.request.json").write_text(json.dumps(fields, default=repr, indent=1))
    child = run_child(
        python_argv("traingate.stages.harness.entrypoint", disguise=ctx.disguise),
        cwd=tree.root if tree is not None else ctx.root,
        budget_s=min(budget_s, ctx.child_budget()) if budget_s else ctx.child_budget(),
        scratch=ctx.scratch,
        env=env or ctx.child_env(),
        name=name,
        stdin_data=request,
        channel=True,
        warm=ctx.warm,
    )
    ended = time.time()
    ctx.entrypoint_runs.append((label, child))
    record, problem = read_harness_result(child, nonce, sent, ctx.payload_models)
    ctx.files_read.append(record.reads if record is not None else None)
    made = read_progress(progress_file, ended) if child.timed_out and progress_file is not None else None
    return EntrypointRun(child=child, result=record.model_dump(mode="json") if record is not None else None, channel_problem=problem, progress=made)


def read_progress(path: Path, ended: float) -> tuple[int, float] | None:
    """(steps, seconds from the last step to `ended`) from a run's progress file; None when it
    holds none (no step made, or not a file the harness wrote)."""
    try:
        steps, at = path.read_text(encoding="ascii")[:64].split()
        return int(steps), max(0.0, ended - float(at))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def start_warm_early(ctx: StageContext, env: dict[str, str]) -> bool:
    """Have the warm interpreter that a later entrypoint run with `env` forks from start its
    imports now, beside the run in progress, when the stage has warm interpreters and this
    machine a second core for them (`os.sched_getaffinity`); True when started. With one core
    the import would only slow the run it overlaps."""
    if ctx.warm is None or len(os.sched_getaffinity(0)) < 2:
        return False
    ctx.warm.start_early(child_environment(env), ctx.root)
    return True


def _request_fields(
    ctx: StageContext, amp: bool | None, instruments: list[str], options: dict[str, Any], deterministic: bool,
    kwargs_override: dict[str, Any], distributed: DistributedSpec | None, entrypoint: EntrypointConfig | None = None,
) -> dict[str, Any]:
    """The entrypoint request's fields but its channel (which only the child's pipe gives)."""
    ep = entrypoint or ctx.config.entrypoint
    if ep is None:
        raise ValueError("no entrypoint configured")
    fields: dict[str, Any] = {
        "target_root": str(ctx.root),
        "test": ep.test,
        "call": ep.call,
        "script": ep.script,
        "args": ep.script_argv(amp),
        "setup": ep.setup,
        "workdir": ep.workdir,
        "prepare": [prepare_words(command) for command in ep.prepare],
        "kwargs": {**ep.kwargs, **kwargs_override},
        "amp_flag": ep.amp_flag,
        "amp": amp,
        "seed": ep.seed,
        "device": ctx.device,
        "instruments": instruments,
        "instrument_options": options,
        "deterministic": deterministic,
        "max_batches": ep.max_batches,
        "max_steps": ep.max_steps,
        "read_at_start": ctx.read_at_start(),
    }
    if distributed is not None:
        fields["distributed"] = distributed.model_dump(mode="json")
    return fields


def read_harness_result(
    child: ChildResult, nonce: str, sent: dict[str, str] | None = None, models: Mapping[str, type[BaseModel]] | None = None
) -> tuple[HarnessResult | None, str | None]:
    """The harness's record, validated, or why there is none that can be trusted (None,
    None: the child handed back nothing, it died first). `sent`: the instrument specs as the
    child named them -> as the stage does (`pipeline/supervision/disguise.py`), so every payload is checked
    against its model (`models`, the stage's) under its real name."""
    if child.channel_problem:
        return None, child.channel_problem
    try:
        body = read_single(child.channel, nonce, HARNESS_RESULT)
        if isinstance(body, dict) and sent:
            _rename_instruments(body, sent)
        return (HarnessResult.model_validate(body, context={MODELS_CONTEXT: models or {}}), None) if body is not None else (None, None)
    except ChannelError as exc:
        return None, str(exc)
    except ValidationError as exc:
        return None, f"a malformed result: {exc.error_count()} error(s), first: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}"


def _rename_instruments(body: dict[str, Any], sent: dict[str, str]) -> None:
    """The instruments of the result (and of each rank's) under the stage's names, in place."""
    distributed = body.get("distributed")
    ranks = distributed.get("ranks") if isinstance(distributed, dict) else None
    for record in [body, *(ranks if isinstance(ranks, list) else [])]:
        if isinstance(record, dict) and isinstance(record.get("instruments"), dict):
            record["instruments"] = {sent.get(spec, spec): payload for spec, payload in record["instruments"].items()}


# Location of the innermost frame (frames innermost first) in the target's code.
innermost_target_frame = findings.target_location


class SiteFields(TypedDict):
    """A line of the target's code as evidence data holds it (a site or frame record)."""

    path: str
    line: int
    function: str


class SiteLike(Protocol):
    """A payload's site model (read-only fields)."""

    @property
    def path(self) -> str: ...
    @property
    def line(self) -> int | None: ...
    @property
    def function(self) -> str | None: ...


class SiteRecord(SiteFields):
    """A line of the target's code with its source text, as evidence data and details give it."""

    code: str


@overload
def site_record(site: Site | TargetFrame) -> SiteRecord: ...
@overload
def site_record(site: Site | TargetFrame | None) -> SiteRecord | None: ...
def site_record(site: Site | TargetFrame | None) -> SiteRecord | None:
    """A payload's site or the harness's frame in the target, as evidence data and the stages'
    details give it; None for no site."""
    return None if site is None else {"path": site.path, "line": site.line, "function": site.function, "code": site.code}


def location_of(site: SiteFields | Sequence[Any] | SiteLike | None) -> Location | None:
    """Location from any record of a place the stages hold: a site record of evidence data,
    a payload's site model or a harness frame, or a (path, line, function) tuple."""
    if not site:
        return None
    line: int | None
    function: str | None
    if isinstance(site, dict):
        path, line, function = site["path"], site["line"], site["function"]
    elif isinstance(site, Sequence):
        path, line, function = site
    else:
        path, line, function = site.path, site.line, site.function
    return Location(path=str(path), line=line, function=function)


def leftover_findings(ctx: StageContext, child: ChildResult, what: str) -> list[Finding]:
    """`leftover-process`: `what` (the test run, a smoke call) left processes running outside
    its process group after it ended (a `setsid` or double-forked daemon); they were killed."""
    return _leftover_finding(ctx, what, [(what, child)], key=what)


def entrypoint_leftover_findings(ctx: StageContext) -> list[Finding]:
    """`leftover-process` over every entrypoint call this stage made, as one finding."""
    runs = [(label, child) for label, child in ctx.entrypoint_runs if child.leftovers]
    labels = ", ".join(dict.fromkeys(label for label, _ in runs))
    what = f"The entrypoint's {labels} call" + ("s" if len(runs) > 1 else "")
    return _leftover_finding(ctx, what, runs, key="entrypoint calls")


def with_leftover_findings(ctx: StageContext, outcome: StageOutcome) -> StageOutcome:
    """`outcome` with `entrypoint_leftover_findings` added: one call covers every run of a stage."""
    extra = entrypoint_leftover_findings(ctx)
    return outcome.model_copy(update={"findings": [*outcome.findings, *extra]}) if extra else outcome


def _leftover_finding(ctx: StageContext, what: str, runs: list[tuple[str, ChildResult]], *, key: str) -> list[Finding]:
    left = [{**proc, "run": label} for label, child in runs for proc in child.leftovers]
    if not left:
        return []
    first = left[0]
    return [
        ctx.finding(
            category=Category.LEFTOVER_PROCESS,
            title=f"{what} left {len(left)} process(es) running",
            location=None,
            problem=(
                f"{what} ended while {len(left)} process(es) it started kept running outside its process group, "
                f"e.g. pid {first['pid']}, which {first['escaped']}: `{first['cmdline'][:200]}`. traingate killed them."
            ),
            impact=(
                "A process that outlives the run that started it keeps running on every machine and CI job that runs this code: "
                "it holds memory, devices and ports, and can rewrite results and reports after they were written."
            ),
            fix="Stop and wait for every background process before the test or the training function returns (a fixture finaliser, a context manager); never detach one with setsid or a double fork.",
            evidence=Evidence(
                kind=EvidenceKind.OBSERVED,
                summary=f"{len(left)} process(es) still running after {what[:1].lower() + what[1:]} ended, outside its process group; killed",
                data={"processes": left[:20], "processes_omitted": max(0, len(left) - 20)},
            ),
            key=key,
        )
    ]


# -- where the entrypoint is ------------------------------------------------------------------


def entrypoint_location(root: Path, call: str) -> Location | None:
    """The `def` line of a `module:function` call, read from the target's files; no line when
    the file does not parse or defines no such function; None when the module's file is not there."""
    module, _, function = call.partition(":")
    base = root.joinpath(*module.split("."))
    for file in (base.with_suffix(".py"), base / "__init__.py"):
        if not file.is_file():
            continue
        rel = file.relative_to(root).as_posix()
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            return Location(path=rel, line=None, function=function)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
                return Location(path=rel, line=node.lineno, function=function)
        return Location(path=rel, line=None, function=function)
    return None


def entrypoint_fallback(ctx: StageContext) -> Location:
    """Where a finding that no observed frame locates points: the entrypoint's `def`, its
    module file, the script, or the observed test's `def`."""
    ep = ctx.config.entrypoint
    if ep is not None and ep.test is not None:
        return location_of_test(ctx.root, ep.test)
    if ep is None or ep.call is None:
        return Location(path=(ep.script if ep else None) or "")
    module, _, function = ep.call.partition(":")
    found = entrypoint_location(ctx.root, ep.call)
    if found is None and ep.setup is not None:
        # A framework's own call (`lightning.pytorch:Trainer.fit`) is not the target's file:
        # the setup that builds its objects is.
        found = entrypoint_location(ctx.root, ep.setup)
    return found or Location(path=module.replace(".", "/") + ".py", function=function or None)


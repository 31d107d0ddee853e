"""Runs each stage as its own agent process and assembles the report from what they return.

The target's code never runs in this process. Each stage agent gets a wall budget; past it
the agent's whole process group is killed and the stage reports `hang` with every thread's
stack. Whatever a stage hands back is validated here; anything malformed is a stage error.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cached_property
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Protocol, cast
from collections.abc import Callable

from pydantic import ValidationError
from traingate.pipeline.model.config import EntrypointConfig, TargetConfig
from traingate.pipeline.model.findings import hang_finding, stage_error
from traingate.pipeline.model.findings import finding as make_finding
from traingate.pipeline.gate.gitinfo import rev_parse
from traingate.pipeline.gate.init_propose import hint as init_hint
from traingate.pipeline.supervision import disguise, warm
from traingate.pipeline.supervision.disguise import Disguise
from traingate.pipeline.supervision.isolation import ChildResult, child_environment, dump_allowance, python_argv, run_child
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.pipeline.gate.policy import decide, stage_score, stage_status
from traingate.pipeline.model.registry import Stage, StageParts, parts, rule_table
from traingate.pipeline.model.rules import ANY_STAGE_CATEGORIES
from traingate.pipeline.model.schema import (
    BaselineComparison,
    BaselineSource,
    Category,
    Environment,
    Evidence,
    EvidenceKind,
    Finding,
    PipelineReport,
    ObservedRun,
    PolicyProvenance,
    Severity,
    StageNotRun,
    StageOutcome,
    StageReport,
    StageStatus,
    TargetInfo,
)
from traingate.pipeline.gate.once_per_run import OncePerRun
from traingate.pipeline.gate.unwatched import unwatched_findings
from traingate.pipeline.gate.schedule import side_by_side, stage_groups, timed_first, usable_cores
from traingate.pipeline.gate import observed_runs, observed_tests
from traingate.pipeline.gate.snapshot import Snapshot, SnapshotError, modification_finding, with_user_paths
from traingate.pipeline.gate.written_files import GateInputs
from traingate.pipeline.gate.torch_probe import torch_facts
from traingate.pipeline.gate.waivers import Adjudicator
from traingate.pipeline.gate.verification import CONFIGURATION_STAGE, added_waivers, review, summary, unverified_findings, waiver_findings
from traingate.stages.common.channel import ChannelError, ChannelSpec, first_notice, new_nonce, read_single
from traingate.stages.contract.messages import AGENT_REPLY, MACHINE_RELEASED, AgentReply, AgentRequest
from traingate.pipeline.supervision.target_env import target_env

from traingate import __version__

AgentDevice = Literal["cpu", "cuda"]  # RunRequest.device, resolved; the agent's request validates it again


class Observer(Protocol):
    """Reporters observe the run; they never drive it."""

    def stage_started(self, name: str, index: int, total: int) -> None: ...

    def stage_finished(self, report: StageReport) -> None: ...


@dataclass
class RunRequest:
    root: Path
    task: str
    version: str
    stages: list[str]
    out: Path
    device: str  # resolved: "cpu" or "cuda"
    baseline: dict[str, Any] | None = None  # the --baseline report.json, checked against PipelineReport
    baseline_path: str | None = None
    baseline_source: BaselineSource | None = None  # --baseline REVISION: its commit and how its report was had
    observers: list[Observer] = field(default_factory=list)
    # `module:function` building the stage registry inside each agent process.
    registry_factory: str = "traingate.pipeline.model.registry:build_registry"
    policy: PolicyProvenance | None = None  # where each policy value came from, for the report
    # The run's copy of the child side, which the target's processes start from (`run_pipeline`).
    disguise: Disguise | None = None
    # The setup module the configuration names, in the baseline's form, where the change edited it
    # (`verification.edited_setup`): the correctness stage observes the training with it too.
    baseline_setup: dict[str, str] = field(default_factory=dict)

    @cached_property
    def baseline_report(self) -> PipelineReport | None:
        """The baseline as the report model the stages read (validated once per run)."""
        return PipelineReport.model_validate(self.baseline) if self.baseline is not None else None


def run_pipeline(request: RunRequest, config: TargetConfig, registry: dict[str, Stage]) -> PipelineReport:
    """Run the stages. The processes that run the target's code run a copy of the gate's
    child-side modules under a name of this run only (`pipeline/supervision/disguise.py`, docs/edited-tests.md)."""
    mask = disguise.build()
    try:
        return _run_stages(replace(request, disguise=mask), config, registry)
    finally:
        disguise.remove(mask)


def _run_stages(request: RunRequest, config: TargetConfig, registry: dict[str, Stage]) -> PipelineReport:
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    reports: list[StageReport] = []
    # Every stage runs on its own copy of the target as it was at the start; removed at the end.
    snapshot = Snapshot(request.root, exclude=request.out)
    try:
        snapshot.take()
    except SnapshotError as exc:  # nothing can be checked: fail closed, naming the file
        return config_error_report(request, str(request.root), "", str(exc))
    # The change's gate configuration and waivers against the baseline's (`verification`).
    verification = review(request.root, request.baseline_report, config)
    # Waivers and the new-findings rule: applied here, to what each stage handed back.
    adjudicator = Adjudicator(config, request.baseline_report, datetime.now(timezone.utc).date(), added_waivers(request.root, verification, config))
    checked = adjudicator.apply(verification.findings)
    request = replace(request, baseline_setup=verification.baseline_setup)
    once = OncePerRun()  # result files written, packages missing: one finding each per run
    agents = agent_host(request, config)
    try:
        with snapshot:
            width = side_by_side(usable_cores(), os.environ)
            for group in stage_groups(request.stages, registry, width):
                _run_group(group, registry, request, config, snapshot, reports, Settling(adjudicator, once), agents, verification.baseline_entrypoint, width=width)
    finally:
        if agents is not None:
            agents.close()
    if config.entrypoint is None:
        reports = UnconfiguredHint(request.root).added_to_each(reports)
    # What the unwatched run left against the watched runs: never waivable, so not adjudicated.
    unwatched = unwatched_findings(reports, CONFIGURATION_STAGE, config.entrypoint.call if config.entrypoint else None, set(config.policy.block_on))
    acceptance = adjudicator.summary()
    settled = configuration_stage([*checked, *waiver_findings(acceptance.waivers, config), *unwatched, *unverified_findings(config)])
    every = [settled, *reports] if settled is not None else reports
    assembled = assemble(request, every, started_at, time.monotonic() - started, compare_baseline(request, every))
    return assembled.model_copy(
        update={"stages_not_run": stages_not_run(list(registry), reports), "acceptance": acceptance, "verification": summary(verification, acceptance.waivers),
                "observed_training": observed_tests.fact(reports)}
    )


def configuration_stage(findings: list[Finding]) -> StageReport | None:
    """The gate's own findings on the change's configuration, listed before the stages'; None when there are none."""
    if not findings:
        return None
    findings = sorted(findings, key=Finding.sort_key)
    status = stage_status(findings, None)
    narrowed = sum(f.blocking for f in findings if f.category is Category.VERIFICATION_NARROWED)
    others = sum(f.blocking for f in findings) - narrowed
    text = (
        f"the change narrowed how it is verified: {narrowed} blocking finding(s)" if narrowed and not others
        else f"{narrowed + others} blocking finding(s) of the gate's own checks" if others
        else "the change's configuration against the baseline's"
    )
    return StageReport(name=CONFIGURATION_STAGE, status=status, score=stage_score(status, findings), duration_s=0.0, summary=text, findings=findings)


@dataclass
class Settling:
    """What the gate applies to each stage's findings in the stages' order, whichever finished
    first: the findings shown once per run, then waivers and the new-findings rule."""

    adjudicator: Adjudicator | None = None
    once: OncePerRun | None = None


def _run_group(
    group: list[str], registry: dict[str, Stage], request: RunRequest, config: TargetConfig, snapshot: Snapshot,
    reports: list[StageReport], settling: Settling, agents: WarmPool | None, baseline_entrypoint: EntrypointConfig | None = None, width: int | None = None,
) -> None:
    """Run the stages of one group (`schedule.stage_groups`) side by side, `width` at once (all
    of them by default), and append their reports in the group's order. A stage that an earlier
    stage's report skips is reported skipped, whether or not it ran (its run is discarded)."""
    def started(name: str) -> None:
        for obs in request.observers:
            obs.stage_started(name, request.stages.index(name) + 1, len(request.stages))

    launched = [name for name in group if _group_skip(registry[name], config, reports) is None]
    for name in group:
        if name not in launched:
            started(name)

    def launch(name: str, released: threading.Event | None) -> AgentRun:
        started(name)  # as it starts: one waiting for the machine is not running yet
        # With no entrypoint configured, a stage that runs the training function observes the tests'.
        configs = observed_tests.stage_configs(config, parts(registry[name]).needs_training, reports)
        if configs[0].entrypoint is None or configs[0].entrypoint.test is None:
            return run_stage_agent(name, registry[name], request, configs[0], snapshot, agents, baseline_entrypoint, released=released)
        # Several agents in turn, each with timed runs of its own: the machine is released when the last ends.
        return run_observing_agents(name, registry[name], request, configs, snapshot, agents, baseline_entrypoint)

    runs = _run_agents(launched, launch, width or len(launched), timed=timed_first(launched, registry))
    for name in group:
        done = runs.get(name)
        skip = _group_skip(registry[name], config, reports)
        if skip is not None:
            for run in (done.parts or [done]) if done is not None else []:
                snapshot.discard(run.root)
            report = StageReport(name=name, status=stage_status([], skip), score=None, duration_s=0.0, summary="not run", skipped_reason=skip)
        else:
            assert done is not None  # not skipped before the group: launched
            report = settle_stage(done, request, snapshot, settling)
        reports.append(report)
        for obs in request.observers:
            obs.stage_finished(report)


def _group_skip(stage: Stage, config: TargetConfig, reports: list[StageReport]) -> str | None:
    """Why a stage is not run after the reports so far: an earlier stage's outcome, or the only
    training in the tests made too few optimizer steps for a verdict."""
    found = parts(stage)
    return _skip_reason(found, reports) or observed_tests.not_measured(config, found.needs_training, reports)


def _run_agents(names: list[str], run: Callable[[str, threading.Event | None], AgentRun], width: int, *, timed: bool = False) -> dict[str, AgentRun]:
    """`run` for each name, at most `width` at once, each starting in the names' order as one
    ends. `timed`: the first name times its runs; it gets an event to set once they are done
    (or it ends), and the others start only then. A group of one starts no thread. An
    interrupt raised here while they run does not wait for them: the command line kills every
    process of the run."""
    if len(names) <= 1:
        return {name: run(name, None) for name in names}
    released = threading.Event()
    if not timed:
        released.set()
    queue, lock, done = iter(names), threading.Lock(), {}

    def worker() -> None:
        while True:
            with lock:
                name = next(queue, None)
            if name is None:
                return
            if timed and name == names[0]:
                try:
                    done[name] = run(name, released)
                finally:
                    released.set()
            else:
                released.wait()
                done[name] = run(name, None)

    workers = min(width, len(names))
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        for future in [pool.submit(worker) for _ in range(workers)]:
            future.result()
        return {name: done[name] for name in names}
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


class UnconfiguredHint:
    """With no entrypoint configured, a stage skipped for want of one names what `traingate
    init` would configure (read from the files once, at the first such stage)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._hint: str | None = None
        self._read = False

    def added_to_each(self, reports: list[StageReport]) -> list[StageReport]:
        return [self.added_to(report) for report in reports]

    def added_to(self, report: StageReport) -> StageReport:
        reason = report.skipped_reason or ""
        # Skipped for want of an entrypoint, or because the tests' only training was too short to measure.
        if report.status is not StageStatus.SKIPPED or ("no entrypoint" not in reason and not reason.startswith("not measured: the test that trained most")):
            return report
        if not self._read:
            self._hint, self._read = init_hint(self.root), True
        text = f"{self._hint}." if self._hint else "`traingate init` found no training entry point to configure."
        return report.model_copy(update={"skipped_reason": f"{reason.rstrip('.')}. {text}"})


def agent_host(request: RunRequest, config: TargetConfig) -> WarmPool | None:
    """The warm interpreter the stage agents of this run are forked from (`AgentHost`), started
    now so its imports overlap the snapshot: one `import torch` for every stage's runs instead
    of one per stage. Started for an entrypoint, and for a test suite whose training the later
    stages may observe (the suite's own run forks from it then, as it does beside smoke calls:
    the suite's training is what they observe). For a suite alone (one stage, no entrypoint) only
    where an import server serves it: a fork of it costs less than a fresh agent and a fresh
    pytest, an interpreter's own `import torch` more. None where the runs would not fork from it
    anyway: nothing to run, warm start off, or a PYTHONPATH that names the folder a run starts in
    (each stage runs in a copy of its own)."""
    # An entrypoint's runs, or a suite's training that later stages observe, are worth a host's
    # own imports; a suite alone is worth only a served host's fork.
    worth_own_imports = config.entrypoint is not None or (config.has_test_suite and len(request.stages) > 1)
    if not (worth_own_imports or config.has_test_suite) or not warm.enabled():
        return None
    agent_env = child_environment()
    runs_env = target_env(agent_env, request.device)
    if warm.folder_dependent(runs_env.get("PYTHONPATH")):
        return None
    scratch = (request.out / "work" / "agents").resolve()
    # With no entrypoint, every run of the stages after the suite runs a test: pytest imported once.
    pool = WarmPool(scratch, disguise=request.disguise, preload=warm.TEST_RUN_IMPORTS if config.entrypoint is None else ())
    return pool if pool.host_agents(runs_env, agent_env, cwd=scratch, served_only=not worth_own_imports) else None


def stages_not_run(known: list[str], reports: list[StageReport], left_out: str = "not requested with --stages") -> list[StageNotRun]:
    """Every known stage whose checks did not run, in the registry's order, with the reason:
    left out (`left_out`: with --stages, or with merge --stages), or skipped (by the gate or by
    the stage itself)."""
    ran = {r.name: r for r in reports}
    missing: list[StageNotRun] = []
    for name in known:
        if name not in ran:
            missing.append(StageNotRun(name=name, reason=left_out))
            continue
        report = ran[name]
        if report.status is StageStatus.SKIPPED:
            missing.append(StageNotRun(name=name, reason=f"skipped: {report.skipped_reason or 'no reason given'}"))
    return missing


def assemble(
    request: RunRequest, stages: list[StageReport], started_at: str, duration_s: float, baseline: BaselineComparison | None
) -> PipelineReport:
    """The whole report; decision and score come from the stage reports alone."""
    decision, score = decide(stages)
    return PipelineReport(
        tool_version=__version__,
        task=request.task,
        version=request.version,
        target=TargetInfo(path=str(request.root), commit=git_commit(request.root)),
        environment=environment(request.device),
        started_at=started_at,
        duration_s=round(duration_s, 3),
        decision=decision,
        score=score,
        stages=stages,
        baseline=baseline,
        policy=request.policy,
    )


def _skip_reason(stage: StageParts, done: list[StageReport]) -> str | None:
    """Profiling a training function that crashes or hangs in its smoke call measures nothing,
    and running it again would only spend the budget a second time: a stage that needs the
    function (`Stage.needs_training`) is skipped, saying what it would have done (`Stage.purpose`)."""
    if not stage.needs_training:
        return None
    purpose = stage.purpose
    for report in done:
        blocking = {f.id: f for f in report.findings if f.blocking}
        for stopped in report.training_stopped:
            f = blocking.get(stopped.finding)
            if f is None:
                continue  # waived, or no longer blocking under the policy
            where = f" at {f.location.path}:{f.location.line}" if f.location else ""
            if stopped.reason == "crash":
                return f"the entrypoint crashed in the {report.name} stage{where}; nothing to {purpose}"
            if stopped.reason == "environment":
                # Installing them is the next step whatever else ran; the finding lists them all.
                return f"packages the target imports are not installed here ({', '.join(stopped.missing)}; see the {report.name} stage); nothing to {purpose}"
            return f"the entrypoint's smoke call did not finish in the {report.name} stage{where}; nothing to {purpose}"
    return None


@dataclass
class AgentRun:
    """One stage's agent as it ended: its copy of the target and the outcome checked here."""

    name: str
    config: TargetConfig
    root: Path
    outcome: StageOutcome
    duration_s: float
    # A stage that observed several tests' training: each test's run (this run's outcome is
    # their merge) and what became of each test.
    parts: list[AgentRun] = field(default_factory=list)
    observed_runs: list[ObservedRun] = field(default_factory=list)


def run_observing_agents(
    name: str, stage: Stage, request: RunRequest, configs: list[TargetConfig], snapshot: Snapshot | None, agents: WarmPool | None,
    baseline_entrypoint: EntrypointConfig | None,
) -> AgentRun:
    """The stage's agent once per observed test (`configs`, one each), in turn within the
    stage's budget (`observed_runs`), each on a fresh copy; one run with their outcomes merged."""

    def one(config: TargetConfig, share: float, index: int) -> AgentRun:
        return run_stage_agent(name, stage, request, config, snapshot, agents, baseline_entrypoint, budget_s=share, part=index)

    done, records = observed_runs.in_turn(configs, float(configs[0].timeout_s), one, lambda run: run.duration_s)
    runs = [run for _, run in done]
    outcome = observed_runs.merged_outcome([(_observed_test(run.config), run.outcome) for run in runs])
    first = runs[0]
    return AgentRun(name=name, config=first.config, root=first.root, outcome=outcome, duration_s=sum(r.duration_s for r in runs), parts=runs, observed_runs=records)


def _observed_test(config: TargetConfig) -> str:
    return (config.entrypoint.test if config.entrypoint is not None else None) or ""


def run_stage_agent(
    name: str, stage: Stage, request: RunRequest, config: TargetConfig, snapshot: Snapshot | None = None, agents: WarmPool | None = None,
    baseline_entrypoint: EntrypointConfig | None = None, budget_s: float | None = None, part: int = 0, released: threading.Event | None = None,
) -> AgentRun:
    """Start the stage's agent on a fresh copy of the target and check what it hands back; the
    findings that depend on the other stages are settled after (`settle_stage`). `budget_s`:
    the stage's budget, or the share of it one observed test's run gets (`part`: its index).
    `released`: set when the agent says its timed runs are done (`StageContext.machine_released`)."""
    # The stage's root: a fresh copy of the target (the user's tree when no snapshot is given).
    root = snapshot.fresh_copy(name) if snapshot is not None else request.root
    budget = float(config.timeout_s) if budget_s is None else budget_s
    margin = stage_margin(budget)
    scratch = (request.out / "work" / (f"{name}-{part + 1}" if part else name)).resolve()
    scratch.mkdir(parents=True, exist_ok=True)

    def agent_request(channel: ChannelSpec) -> AgentRequest[TargetConfig, PipelineReport]:
        # Built as the agent starts: its budget begins then (see the wait below).
        return AgentRequest[TargetConfig, PipelineReport](
            stage=name, root=str(root), config=config, device=cast(AgentDevice, request.device), deadline=time.time() + budget, scratch=str(scratch),
            margin_s=margin, baseline=request.baseline_report, registry=request.registry_factory, channel=channel, agents_host=agents is not None,
            origin=str(request.root), disguise=request.disguise.model_dump() if request.disguise is not None else None,
            baseline_entrypoint=baseline_entrypoint.model_dump(mode="json") if baseline_entrypoint is not None else None,
            baseline_setup=request.baseline_setup,
        )

    # The request goes on the agent's stdin and the outcome comes back over a pipe with this
    # nonce: no file in the work folder that a target's process could rewrite before it is read.
    nonce = new_nonce()

    def watch(data: bytes) -> bool | None:
        # Read before the agent is dead, the notice only lets the waiting stages start: a
        # forged one would share the machine with timed runs, which their load readings show.
        notice = first_notice(data, nonce, MACHINE_RELEASED)
        if notice and released is not None:
            released.set()
        return notice

    def sent(fd: int) -> bytes:
        built = agent_request(ChannelSpec(fd=fd, nonce=nonce))
        # For people reading the work folder, with the deadline sent: without the baseline and the channel (no nonce).
        shown = built.model_dump(mode="json", exclude={"baseline", "channel"})
        (scratch / "agent-request.json").write_text(json.dumps(shown, indent=1))
        return built.model_dump_json().encode()

    # The agents' host's imports are the gate's, not the stage's: the agent waits for them
    # before its budget starts, so a busy machine that slows them leaves the target's budget
    # whole (a hanging entrypoint is still the execution stage's one finding). Past the wait's
    # limit the agent starts fresh within its budget and keeps its margin.
    child = run_child(
        python_argv("traingate.stages.agent", disguise=request.disguise), cwd=root, budget_s=budget, scratch=scratch, name="agent", stdin_data=sent, channel=True, warm=agents,
        keep_s=margin, ready_wait_s=warm.READY_TIMEOUT_S if agents is not None else None, watch=watch if released is not None else None,
    )
    ctx = GateView(stage=name, root=root, config=config)
    outcome = with_user_paths(_read_outcome(ctx, stage, child, nonce), root, request.root)
    return AgentRun(name=name, config=config, root=root, outcome=outcome, duration_s=child.duration_s)


def settle_stage(run: AgentRun, request: RunRequest, snapshot: Snapshot | None, settling: Settling) -> StageReport:
    """The stage's report: its findings with what its run wrote into the target's files, less
    what an earlier stage reported once for the run, under the waivers; called in the stages'
    order."""
    name, outcome, once, adjudicator = run.name, run.outcome, settling.once, settling.adjudicator
    each = run.parts or [run]  # the observed tests' runs, one each, or the stage's one run
    extra: list[Finding] = []
    if snapshot is not None:
        seen = once or OncePerRun()
        for part in each:
            extra += written_findings(name, snapshot, part.root, GateInputs.of(part.config, part.outcome.files_read), seen)
            snapshot.discard(part.root)
    named = [observed_tests.with_test_named(part.outcome.findings, part.config) for part in each]
    # Several observed tests' runs: a finding more than one of them showed is reported once.
    findings = sorted(observed_tests.merged([*named, extra]) if run.parts else [*named[0], *extra], key=Finding.sort_key)
    if once is not None:
        findings = once.first_seen(findings, outcome.training_stopped)
    if adjudicator is not None:  # after the outcome was checked against the policy as the stage saw it
        findings = adjudicator.apply(findings)
    return stage_report(name, outcome, findings, run.duration_s).model_copy(update={"observed_runs": run.observed_runs})


def stage_report(name: str, outcome: StageOutcome, findings: list[Finding], duration_s: float) -> StageReport:
    """The stage's report: its outcome with the findings the gate settled, status and score."""
    status = stage_status(findings, outcome.skipped_reason)
    return StageReport(
        name=name,
        status=status,
        score=stage_score(status, findings),
        duration_s=round(duration_s, 3),
        summary=outcome.summary,
        skipped_reason=outcome.skipped_reason,
        metrics=outcome.metrics,
        findings=findings,
        details=outcome.details,
        tests=outcome.tests,
        training_stopped=outcome.training_stopped,
        observed_training=outcome.observed_training,
        observed_files=outcome.observed_files,
        runs_left=outcome.runs_left,
        determinism=outcome.determinism,
    )


def stage_margin(budget_s: float) -> float:
    """What a stage keeps back from its own child runs: after killing one at its budget, it can
    still report before this process begins dumping the agent's stacks (`dump_allowance`)."""
    return min(5.0, budget_s * 0.1) + dump_allowance(budget_s)


def written_findings(name: str, snapshot: Snapshot, root: Path, inputs: GateInputs, once: OncePerRun) -> list[Finding]:
    """`target-modified` for the files the gate or a later run reads that the stage's run
    changed (always blocking), and the low result-files finding for the other tracked files it
    only wrote, unless an earlier stage reported them (`traingate.pipeline.gate.written_files`)."""
    changes = snapshot.changes(root)
    if not changes:
        return []
    read, results = changes.partition(inputs)
    found = [modification_finding(name, read, inputs.read_by_the_run([*read.modified, *read.deleted]), inputs.unknown_reads)] if read else []
    written = once.result_writes.finding(name, results.modified, results.deleted)
    return [*found, written] if written is not None else found


@dataclass(frozen=True)
class GateView:
    """What the gate knows of a stage when it checks what the stage's agent handed back."""

    stage: str
    root: Path
    config: TargetConfig

    @property
    def block_on(self) -> set[Severity]:
        return set(self.config.policy.block_on)


def _read_outcome(ctx: GateView, stage: Stage, child: ChildResult, nonce: str) -> StageOutcome:
    if child.timed_out:
        hang = hang_finding(ctx, child, f"The {ctx.stage} stage", run="stage-agent")
        return StageOutcome(summary=f"overran its {ctx.config.timeout_s:.0f}s budget", findings=[hang])
    try:
        if child.channel_problem:
            raise ChannelError(child.channel_problem)
        body = read_single(child.channel, nonce, AGENT_REPLY, notice=MACHINE_RELEASED)
        if body is None:
            return _error(ctx, "the stage agent ended without handing back a result", "agent-no-result", child)
        reply = AgentReply[StageOutcome].model_validate(body)
        if reply.error is not None:
            return _error(ctx, "the stage raised an exception", "agent-exception", child, reply.error)
        outcome = reply.outcome
        assert outcome is not None  # a reply holds exactly one of outcome and error
    except (ChannelError, ValidationError) as exc:
        return _error(ctx, "the stage handed back a malformed result", "malformed-result", child, str(exc))
    problem = _inconsistency(ctx, stage, outcome)
    if problem:
        return _error(ctx, f"the stage handed back an inconsistent result: {problem}", "inconsistent-result", child)
    return outcome


def _inconsistency(ctx: GateView, stage: Stage, outcome: StageOutcome) -> str | None:
    # A stage's own categories, the gate's, and those any stage may report (their rules say so).
    allowed = parts(stage).categories | ANY_STAGE_CATEGORIES | rule_table().reported_by_any_stage()
    for f in outcome.findings:
        if f.stage != ctx.stage:
            return f"finding {f.id} claims stage {f.stage!r}"
        if f.category not in allowed:
            return f"category {f.category.value} does not belong to this stage"
        rule = rule_table().by_id(f.rule)
        if rule is None or rule.category is not f.category:
            return f"finding {f.id} names rule {f.rule!r}, not a rule of {f.category.value}"
        # Both ways: a stage can neither block against the rule and the policy nor wave through what they block on.
        if f.blocking != rule.blocking(f.severity, f.evidence.kind, ctx.block_on):
            return f"finding {f.id} {'blocks' if f.blocking else 'does not block'} against its rule ({rule.blocks.value}) and the policy"
    for m in outcome.metrics:
        if not m.id:
            return f"metric {m.name!r} has no id"
    return None


def _error(ctx: GateView, what: str, reason: str, child: ChildResult, detail: str = "") -> StageOutcome:
    """The stage's result cannot be used: one blocking `stage-error`, keyed by `reason`."""
    return StageOutcome(summary=what, findings=[stage_error(ctx.stage, what, reason=reason, block_on=ctx.block_on, child=child, detail=detail)])


def environment(device: str) -> Environment:
    facts = torch_facts()  # this process never imports torch (pipeline/gate/torch_probe.py)
    device_name = (facts.cuda_device_name if device == "cuda" else None) or _cpu_name() or platform.processor() or platform.machine()
    return Environment(
        python=platform.python_version(),
        torch=facts.version,
        device=device,
        device_name=device_name,
        platform=f"{sys.platform} {platform.machine()}",
    )


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def git_commit(root: Path) -> str | None:
    return rev_parse(root, "HEAD")


def compare_baseline(request: RunRequest, reports: list[StageReport]) -> BaselineComparison | None:
    base = request.baseline_report
    if base is None:
        return None
    old_ids = {f.id for s in base.stages for f in s.findings}
    new_ids = {f.id for s in reports for f in s.findings}
    # Matched on the metric's id: its label may be reworded between versions (no id: written before ids existed).
    old_metrics = {(s.name, m.id): m for s in base.stages for m in s.metrics if m.id}
    deltas = []
    for s in reports:
        for m in s.metrics:
            old = old_metrics.get((s.name, m.id))
            if old and isinstance(old.value, (int, float)) and isinstance(m.value, (int, float)):
                deltas.append({"stage": s.name, "metric": m.name, "metric_id": m.id, "unit": m.unit, "baseline": old.value, "current": m.value})
    return BaselineComparison(
        path=request.baseline_path or "",
        version=base.version,
        source=request.baseline_source,
        new_findings=sorted(new_ids - old_ids),
        fixed_findings=sorted(old_ids - new_ids),
        persisting_findings=sorted(old_ids & new_ids),
        metric_deltas=deltas,
    )


def config_error_report(request: RunRequest, file: str, key: str, message: str) -> PipelineReport:
    """The report written when the configuration is invalid: one blocking config-error."""
    finding = make_finding(
        stage=CONFIGURATION_STAGE,
        category=Category.CONFIG_ERROR,
        title=f"Invalid configuration: {key or file}",
        location=None,
        problem=f"{file}: {key + ': ' if key else ''}{message}",
        fix=f"Correct `{key}` in {file} (see traingate's docs/configuration.md)." if key else f"Correct {file}.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=message, data={"file": file, "key": key}),
        block_on=set(),  # the rule always blocks
        key=f"{file}:{key}",
    )
    return _nothing_run(request, finding, "invalid configuration")


def _nothing_run(request: RunRequest, finding: Finding, summary: str) -> PipelineReport:
    """A report of no stage run: the gate's one blocking finding that says why."""
    stage = StageReport(name=CONFIGURATION_STAGE, status=stage_status([finding], None), score=0, duration_s=0.0, summary=summary, findings=[finding])
    return assemble(request, [stage], datetime.now(timezone.utc).isoformat(timespec="seconds"), 0.0, None)



def baseline_unavailable_report(request: RunRequest, revision: str, problem: str) -> PipelineReport:
    """The report written when `--baseline REVISION` gave no baseline: one blocking finding
    saying how to make the base reachable. Never a run without the baseline it was asked for."""
    finding = make_finding(
        stage=CONFIGURATION_STAGE,
        category=Category.BASELINE_UNAVAILABLE,
        title=f"The baseline {revision} could not be verified",
        location=None,
        problem=f"{problem}. Nothing was run: a change is judged against its base or not at all.",
        fix=(
            "Fetch the base into the checkout (actions/checkout with `fetch-depth: 0`, or `git fetch origin <base>`; on GitLab "
            "`GIT_DEPTH: 0`), or give `--baseline` a report.json of the base."
        ),
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=problem[:300], data={"revision": revision}),
        block_on=set(),  # the rule always blocks
        key=f"baseline:{revision}",
    )
    return _nothing_run(request, finding, "baseline unavailable")

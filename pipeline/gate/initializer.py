"""`traingate init [PATH]`: find the repo's training, propose a tiny configuration, check
that it reaches enough optimizer steps, and write a commented `traingate.toml`.

The check runs the proposed entrypoint as `traingate run --stages correctness` would (the
registered stage that reports the optimizer steps it observed): on a
snapshot of the target, in a stage agent and its child processes under the probes, within
`--budget` seconds. The repo's code is never imported here, and never edited: the only file
written is `traingate.toml` (with `--dry-run`, not even that).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from traingate.pipeline.gate.init_propose import ENOUGH_STEPS, Candidate, candidates
from traingate.pipeline.gate.init_scan import Found, scan
from traingate.pipeline.gate.init_toml import check_written, render
from traingate.pipeline.gate.orchestrator import RunRequest, run_pipeline
from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.model.registry import build_registry, rule_table, step_checking_stage
from traingate.pipeline.model.schema import PipelineReport
from traingate.pipeline.model.tomlcompat import tomllib

CONFIG_NAME = "traingate.toml"
# Candidates tried in the check, best first, when the one before did not reach enough steps.
MAX_TRIES = 3


@dataclass
class CheckResult:
    """What the check run of one candidate showed."""

    steps: int | None  # optimizer steps the correctness stage observed; None: not measured
    duration_s: float
    problems: list[str] = field(default_factory=list)  # crash, hang, stage error: why it fell short
    findings: int = 0  # other findings of the run, which `traingate run` reports

    @property
    def enough(self) -> bool:
        return not self.problems and self.steps is not None and self.steps >= ENOUGH_STEPS


@dataclass
class InitOutcome:
    text: str | None  # the file, None when nothing was found
    chosen: Candidate | None
    check: CheckResult | None
    messages: list[str]  # for the terminal: what was decided, what was not


def existing_configuration(root: Path) -> str | None:
    """The file that already configures traingate, if any."""
    if (root / CONFIG_NAME).is_file():
        return CONFIG_NAME
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
            return None
        tool = data.get("tool")
        if isinstance(tool, dict) and "traingate" in tool:
            return "pyproject.toml [tool.traingate]"
    return None


def propose(root: Path, *, device: str, check: bool, budget_s: float) -> InitOutcome:
    found = scan(root)
    listed = candidates(found, device)
    if not listed:
        return InitOutcome(None, None, None, nothing_found(found))
    chosen, result, tried = listed[0], None, list[str]()
    if check:
        chosen, result, tried = checked_choice(root, listed, device, budget_s)
    header = header_lines(chosen, result, listed, found) + [f"Also tried: {line}" for line in tried]
    text = render(chosen, header, tests_line(root, found))
    messages = terminal_lines(chosen, result, listed) + [f"Also tried: {line}" for line in tried]
    invalid = check_written(text, root)
    if invalid is not None:
        messages.append(f"Until the FILL IN lines are filled, `traingate run` stops at a configuration error: {invalid}")
    return InitOutcome(text, chosen, result, messages)


def checked_choice(root: Path, listed: list[Candidate], device: str, budget_s: float) -> tuple[Candidate, CheckResult | None, list[str]]:
    """The first runnable candidate whose check reaches enough steps. Else the best candidate
    that needs filling in, or, without one, the first that ran; and what the tries showed."""
    tried: list[str] = []
    first: tuple[Candidate, CheckResult] | None = None
    for candidate in [c for c in listed if c.runnable][:MAX_TRIES]:
        result = check_run(root, candidate, device, budget_s)
        if result.enough:
            return candidate, result, tried
        tried.append(f"{candidate.label} ({candidate.where}): {check_line(result, candidate)}")
        if missing_package(result):
            return candidate, result, tried[:-1]  # right once the package is installed
        first = first or (candidate, result)
    unfilled = next((c for c in listed if not c.runnable), None)
    if unfilled is not None:
        return unfilled, None, tried
    return (first[0], first[1], tried[1:]) if first is not None else (listed[0], None, tried)


def missing_package(result: CheckResult) -> bool:
    """The check stopped only because a package the training imports is not installed here."""
    return bool(result.problems) and all("ModuleNotFoundError" in p or p.startswith("environment") for p in result.problems)


def check_run(root: Path, candidate: Candidate, device: str, budget_s: float) -> CheckResult:
    """Run the candidate under the correctness stage's probes, as `traingate run` would."""
    config = TargetConfig.model_validate({
        "tests": False, "timeout_s": budget_s, "entrypoint": {**candidate.entrypoint, "kwargs": candidate.kwargs},
    })
    out = Path(tempfile.mkdtemp(prefix="traingate-init-"))
    try:
        request = RunRequest(root=root, task="init", version="check", stages=[step_checking_stage()], out=out, device=device)
        return read_check(run_pipeline(request, config, build_registry()))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def read_check(report: PipelineReport) -> CheckResult:
    [stage] = report.stages
    steps = next((m.value for m in stage.metrics if m.id == "steps.observed"), None)
    # What stops the training run: the target's code crashing in the stage's run (the categories
    # any stage may report), a hang, the stage failing, packages missing, processes left behind.
    stopping = {c.value for c in rule_table().reported_by_any_stage()} | {"hang", "stage-error", "environment", "leftover-process"}
    problems = [
        f"{f.category}: {f.title}" + (f" ({f.location.path}:{f.location.line})" if f.location and f.location.line else "")
        for f in stage.findings if str(f.category) in stopping
    ]
    if stage.skipped_reason:
        problems.append(f"the check was skipped: {stage.skipped_reason}")
    others = sum(1 for f in stage.findings if str(f.category) not in stopping)
    return CheckResult(int(steps) if isinstance(steps, (int, float)) else None, stage.duration_s, problems, others)


def check_line(result: CheckResult | None, chosen: Candidate) -> str:
    if result is None:
        return "Not checked: " + ("the FILL IN lines must be filled first." if not chosen.runnable else "--no-check was given.")
    if result.enough:
        line = f"Checked: it reached {result.steps} optimizer steps in {result.duration_s:.0f} s under the {step_checking_stage()} stage's probes."
        return line + (f" That run also found {result.findings} finding(s): `traingate run` reports them." if result.findings else "")
    if result.problems:
        return "The check run fell short: " + "; ".join(result.problems)
    return f"The check run reached {result.steps or 0} optimizer steps, fewer than the {ENOUGH_STEPS} the performance stage measures: raise max_batches, or the epochs or steps in args/kwargs."


def header_lines(chosen: Candidate, result: CheckResult | None, listed: list[Candidate], found: Found) -> list[str]:
    lines = [
        "traingate's configuration, written by `traingate init` (each key: docs/configuration.md).",
        f"Training entry point: {chosen.label} ({chosen.where}): {chosen.why}.",
        check_line(result, chosen),
    ]
    lines += [f"FILL IN {f.what}" for f in chosen.fill_in]
    lines += [f"Note: {note}." for note in chosen.notes]
    others = [c for c in listed if c is not chosen][:4]
    if others:
        lines.append("Other candidates: " + "; ".join(f"{c.label} ({c.where})" for c in others) + ".")
    if found.unreadable:
        lines.append(f"Not read (not valid Python here): {', '.join(found.unreadable[:5])}.")
    return lines


def terminal_lines(chosen: Candidate, result: CheckResult | None, listed: list[Candidate]) -> list[str]:
    lines = [f"Training entry point: {chosen.label} ({chosen.where}): {chosen.why}.", check_line(result, chosen)]
    lines += [f"Could not decide: {f.what}." for f in chosen.fill_in]
    lines += [f"Note: {note}." for note in chosen.notes]
    if len(listed) > 1:
        lines.append(f"{len(listed) - 1} other candidate(s) are listed in the file's header.")
    return lines


def nothing_found(found: Found) -> list[str]:
    return [
        f"No training entry point found in {found.files} Python file(s): no function or method calls backward() and an "
        "optimizer's step(), a trainer's fit() or train(), and no script's __main__ reaches one.",
        "Configure [entrypoint] by hand: docs/configuration.md, 'Entrypoint shapes'.",
    ]


def tests_line(root: Path, found: Found) -> str | None:
    """`tests`: the default `["tests"]` when that folder exists; else the folders holding test
    files; else `false` (no suite)."""
    if (root / "tests").is_dir():
        return None
    folders = sorted({str(Path(f.path).parent) for f in found.functions if Path(f.path).name.startswith("test_")})
    if folders:
        return f"tests = {[f for f in folders]!r}   # the folders holding test files".replace("'", '"')
    return "tests = false   # no test files found: the execution stage runs no suite"


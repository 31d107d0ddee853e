"""`traingate run` and `traingate schema`."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from pydantic import ValidationError

from traingate import __version__
from traingate.pipeline.config import ConfigError, TargetConfig, check_safe_name, load_config, safe_name_from
from traingate.pipeline.lifecycle import (
    LOCK_NAME,
    Interrupted,
    OutputBusy,
    claim_output,
    interrupt_handling,
    release_output,
    stop_after_interrupt,
    write_atomic,
)
from traingate.pipeline.orchestrator import RunRequest, config_error_report, run_pipeline
from traingate.pipeline.processes import become_subreaper, kill_descendants
from traingate.pipeline.rules import RULES, find_rule
from traingate.pipeline.rules import explain as explain_rule
from traingate.pipeline.policy_source import POLICY_ENV, PolicyFileError, ci_policy_path, load_ci_policy, resolve_policy
from traingate.pipeline.schema import PipelineReport, PolicyProvenance, StageReport
from traingate.reports import render_report_md, render_stage_md, render_summary
from traingate.pipeline.registry import build_registry, stage_names


class ExitCode(IntEnum):
    """The gate's answers: it passed, it blocked, or it could not run as asked."""

    PASS = 0
    BLOCK = 1
    USAGE = 2


DESCRIPTION = """\
traingate runs a PyTorch training repo's tests, smoke-calls its training entrypoint, profiles
the training loop and checks it for concurrency hazards, then answers PASS or BLOCK.
Exit status: 0 PASS, 1 BLOCK, 2 usage or configuration error."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="traingate", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"traingate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="verify one version of a target repo",
        description="Verify one version of a target repo and write report.json, report.md and one <stage>.md per stage.",
    )
    run.add_argument("target", nargs="?", default=".", help="the target repo's root (default: the current folder)")
    run.add_argument("--task", help="task id (default: `task` in the configuration, else the folder's name)")
    run.add_argument("--version", dest="task_version", metavar="V", help="version label (default: the target's git commit, else 'local')")
    run.add_argument(
        "--stages",
        default=None,
        help=f"comma-separated stages to run, in this order: {','.join(stage_names())} (default: all)",
    )
    run.add_argument("--out", type=Path, help="output folder (default: traingate-reports/<task>/<version>)")
    run.add_argument("--baseline", type=Path, metavar="REPORT_JSON", help="an earlier report.json to compare findings and metrics with")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the target runs (default: auto = cuda when available)")
    run.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help=f"the CI's policy: a TOML file with the keys of [tool.traingate.policy] (default: ${POLICY_ENV}); "
        "the target's own [policy] may only tighten it",
    )
    sub.add_parser("schema", help="print the JSON Schema of report.json")
    explain = sub.add_parser(
        "explain",
        help="what a finding category checks, how it measures, what blocks and how to fix it",
        description="Explain one finding category; without one, list every category with its one-line description.",
    )
    explain.add_argument("category", nargs="?", help="a category as reports name it, e.g. memory-leak")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "schema":
        print(json.dumps(PipelineReport.model_json_schema(), indent=2))
        return ExitCode.PASS
    if args.command == "explain":
        return explain_command(args.category)
    # Orphans of the stages' processes (double-forked setsid daemons) come back here, not to init.
    become_subreaper()
    try:
        with interrupt_handling():
            try:
                return run_command(parser, args)
            except Interrupted as stop:  # cleaned up while a second signal is still ignored
                return interrupted(stop)
    except Interrupted as stop:  # arrived while the handlers were being restored
        return interrupted(stop)
    finally:
        kill_descendants()  # a last sweep before the folder is free for the next run
        release_output()


def explain_command(category: str | None) -> int:
    """`traingate explain [CATEGORY]`: one rule in full, or every category's one-liner."""
    if category is None:
        width = max(len(rule.category.value) for rule in RULES)
        for listed in RULES:
            print(f"{listed.category.value:<{width}}  {listed.stage:<11}  {listed.description}")
        return ExitCode.PASS
    rule = find_rule(category)
    if rule is None:
        print(f"traingate: error: unknown category {category!r} (`traingate explain` lists them)", file=sys.stderr)
        return ExitCode.USAGE
    print(explain_rule(rule))
    return ExitCode.PASS


def interrupted(stop: Interrupted) -> int:
    """SIGINT/SIGTERM: kill every process the run started, leave no verdict, exit 130/143."""
    stop_after_interrupt()
    print(f"traingate: interrupted by {stop}; every process it started was stopped and no verdict was written", file=sys.stderr)
    return stop.exit_status


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    registry = build_registry()
    try:
        inputs = validate_inputs(args, tuple(registry))
    except UsageError as exc:
        print(f"traingate: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        claim_output(inputs.out, [*registry, "configuration"])
    except OutputBusy as exc:
        print(f"traingate: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    request = RunRequest(
        root=inputs.root, task=inputs.task, version=inputs.version, stages=inputs.stages, out=inputs.out, device=inputs.device,
        baseline=inputs.baseline, baseline_path=str(args.baseline) if args.baseline else None,
        observers=[ProgressPrinter()], policy=inputs.policy,
    )
    if inputs.config_problem is not None or inputs.config is None:
        problem = inputs.config_problem
        assert problem is not None
        print(f"traingate: configuration error: {problem}", file=sys.stderr)
        report = config_error_report(request, problem.file, problem.key, problem.message)
        write_reports(report, inputs.out)
        return ExitCode.USAGE
    report = run_pipeline(request, inputs.config, registry)
    write_reports(report, inputs.out)
    print(render_summary(report), end="")
    print(f"Reports: {inputs.out}")
    return ExitCode.PASS if report.decision.value == "PASS" else ExitCode.BLOCK


class UsageError(Exception):
    """The command line asks for something that cannot run; one line, exit status 2."""


@dataclass
class RunInputs:
    """Everything `traingate run` was asked, checked before any stage runs."""

    root: Path
    stages: list[str]
    device: str
    baseline: dict[str, object] | None
    config: TargetConfig | None  # None when the target's configuration is invalid
    config_problem: ConfigError | None
    policy: PolicyProvenance | None
    task: str
    version: str
    out: Path


def validate_inputs(args: argparse.Namespace, known_stages: tuple[str, ...]) -> RunInputs:
    """Check the command line, the CI policy and the target's configuration; create `--out`.

    Raises UsageError for anything that makes the run impossible. An invalid target
    configuration is not raised: it is reported (a `config-error` report in `--out`)."""
    root = Path(args.target).resolve()
    stages = parse_stages(args.stages, known_stages)
    device = resolve_device(args.device)
    baseline = read_baseline(args.baseline) if args.baseline is not None else None
    ci_path = ci_policy_path(args.policy)
    try:
        ci_policy = load_ci_policy(ci_path) if ci_path is not None else None
    except PolicyFileError as exc:
        raise UsageError(f"{'--policy' if args.policy is not None else POLICY_ENV}: {exc}") from None

    config_problem: ConfigError | None = None
    config: TargetConfig | None = None
    policy: PolicyProvenance | None = None
    try:
        config, config_file = load_config(root)
        effective, policy = resolve_policy(config.policy, config_file, ci_policy)
        config = config.model_copy(update={"policy": effective})
    except ConfigError as exc:
        config_problem = exc
        if ci_policy is not None:
            policy = resolve_policy(ci_policy.policy, None, ci_policy)[1]
    task = args.task or (config.task if config and config.task else None) or safe_name_from(root.name)
    version = args.task_version or default_version(root)
    for option, value in (("--task", task), ("--version", version)):
        try:
            check_safe_name(value)
        except ValueError as exc:
            raise UsageError(f"{option}: {exc}") from None
    out = prepare_out((args.out or Path("traingate-reports") / task / version).resolve(), root)
    return RunInputs(root, stages, device, baseline, config, config_problem, policy, task, version, out)


def parse_stages(option: str | None, known: tuple[str, ...]) -> list[str]:
    stages = [s.strip() for s in (option or ",".join(known)).split(",") if s.strip()]
    unknown = [s for s in stages if s not in known]
    if unknown or not stages:
        raise UsageError(f"--stages: unknown stage(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}")
    return [s for s in known if s in stages]


def read_baseline(path: Path) -> dict[str, object]:
    """An earlier report.json, checked against the report schema before anything runs."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"--baseline: cannot read {path}: {reason}") from None
    try:
        PipelineReport.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise UsageError(f"--baseline: {path} is not a traingate report.json: {where}: {err['msg']}") from None
    return dict(data)


def _earlier_output(folder: Path) -> bool:
    """An earlier run's output folder (its report, or the lock a run leaves there)."""
    return (folder / "report.json").is_file() or (folder / LOCK_NAME).is_file()


def prepare_out(out: Path, root: Path) -> Path:
    """Create the output folder, or say in one line why it cannot be used.

    It may lie inside the target (it is left out of the snapshot the stages run on), but it
    may not be the target itself, nor one of the target's own folders holding other files."""
    if out == root:
        raise UsageError(f"--out: {out} is the target's root; reports would overwrite the target's files")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} exists and is not a folder")
    if out.is_relative_to(root) and out.is_dir() and any(out.iterdir()) and not _earlier_output(out):
        raise UsageError(f"--out: {out} is a folder of the target with its own files; choose a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise UsageError(f"--out: cannot write to {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"--out: cannot write to {out}: permission denied")
    return out


def resolve_device(choice: str) -> str:
    import torch

    available = torch.cuda.is_available()
    if choice == "cuda" and not available:
        raise UsageError("--device cuda: no CUDA device is available here")
    if choice == "auto":
        return "cuda" if available else "cpu"
    return choice


def default_version(root: Path) -> str:
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "local"


def write_reports(report: PipelineReport, out: Path) -> None:
    """Each file appears whole or not at all; report.json, the one CI reads, comes last."""
    for stage in report.stages:
        write_atomic(out / f"{stage.name}.md", render_stage_md(report, stage))
    write_atomic(out / "report.md", render_report_md(report))
    write_atomic(out / "report.json", report.model_dump_json(indent=2) + "\n")


class ProgressPrinter:
    """Prints one line per stage as it starts and ends."""

    def stage_started(self, name: str, index: int, total: int) -> None:
        print(f"[{index}/{total}] {name} ...", flush=True)

    def stage_finished(self, report: StageReport) -> None:
        blocking = sum(f.blocking for f in report.findings)
        detail = report.skipped_reason or report.summary
        print(f"      {report.name}: {report.status.value} in {report.duration_s:.1f}s, {len(report.findings)} finding(s), {blocking} blocking — {detail}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

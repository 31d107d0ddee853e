"""`traingate run` and `traingate schema`."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from enum import IntEnum
from pathlib import Path

from traingate import __version__
from traingate.pipeline.config import ConfigError, load_config
from traingate.pipeline.orchestrator import RunRequest, config_error_report, run_pipeline
from traingate.pipeline.schema import PipelineReport, StageReport
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
    sub.add_parser("schema", help="print the JSON Schema of report.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "schema":
        print(json.dumps(PipelineReport.model_json_schema(), indent=2))
        return ExitCode.PASS
    return run_command(parser, args)


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    root = Path(args.target).resolve()
    registry = build_registry()
    known = tuple(registry)
    stages = [s.strip() for s in (args.stages or ",".join(known)).split(",") if s.strip()]
    unknown = [s for s in stages if s not in known]
    if unknown or not stages:
        parser.error(f"--stages: unknown stage(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}")
    stages = [s for s in known if s in stages]
    device = resolve_device(parser, args.device)
    baseline = None
    if args.baseline is not None:
        try:
            baseline = json.loads(args.baseline.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            parser.error(f"--baseline: cannot read {args.baseline}: {exc}")

    config_problem: ConfigError | None = None
    try:
        config, _source = load_config(root)
    except ConfigError as exc:
        config_problem, config = exc, None
    task = args.task or (config.task if config and config.task else None) or root.name
    version = args.task_version or default_version(root)
    out = (args.out or Path("traingate-reports") / task / version).resolve()
    out.mkdir(parents=True, exist_ok=True)
    request = RunRequest(
        root=root, task=task, version=version, stages=stages, out=out, device=device,
        baseline=baseline, baseline_path=str(args.baseline) if args.baseline else None,
        observers=[ProgressPrinter()],
    )
    if config_problem is not None or config is None:
        assert config_problem is not None
        print(f"traingate: configuration error: {config_problem}", file=sys.stderr)
        report = config_error_report(request, config_problem.file, config_problem.key, config_problem.message)
        write_reports(report, out)
        return ExitCode.USAGE
    report = run_pipeline(request, config, registry)
    write_reports(report, out)
    print(render_summary(report), end="")
    print(f"Reports: {out}")
    return ExitCode.PASS if report.decision.value == "PASS" else ExitCode.BLOCK


def resolve_device(parser: argparse.ArgumentParser, choice: str) -> str:
    import torch

    available = torch.cuda.is_available()
    if choice == "cuda" and not available:
        parser.error("--device cuda: no CUDA device is available here")
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
    (out / "report.json").write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_report_md(report), encoding="utf-8")
    for stage in report.stages:
        (out / f"{stage.name}.md").write_text(render_stage_md(report, stage), encoding="utf-8")


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

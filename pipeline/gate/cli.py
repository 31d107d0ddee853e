"""`traingate run` and `traingate schema`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from pydantic import ValidationError
from traingate.pipeline.model.config import TargetConfig, check_safe_name, safe_name_from
from traingate.pipeline.gate.config_file import ConfigError, load_config
from traingate.pipeline.gate.gitinfo import rev_parse
from traingate.pipeline.model.history import HistoryError, load_history
from traingate.pipeline.supervision.lifecycle import (
    LOCK_NAME,
    Interrupted,
    OutputBusy,
    claim_output,
    interrupt_handling,
    release_output,
    stop_after_interrupt,
    write_atomic,
)
from traingate.pipeline.gate.merge import MergeError, load_report, merge_reports
from traingate.pipeline.gate import base_revision
from traingate.pipeline.gate.orchestrator import RunRequest, baseline_unavailable_report, config_error_report, run_pipeline
from traingate.pipeline.gate.outputs import FORMATS, FormatError, Written, display_path, parse_formats, repository_root, run_facts, write_reports
from traingate.pipeline.gate.policy_source import POLICY_ENV, PolicyFileError, ci_policy_path, load_ci_policy, pin_suite, resolve_policy
from traingate.pipeline.supervision.processes import become_subreaper, kill_descendants
from traingate.pipeline.model.registry import RegistryError, build_registry, history_metrics, rule_table, stage_names
from traingate.pipeline.model.schema import BaselineSource, PipelineReport, PolicyProvenance, StageReport
from traingate.pipeline.gate.torch_probe import torch_facts
from traingate.reports import render_summary
from traingate.reports.history import render_history_md
from traingate.reports.render import one_line

from traingate import __version__


class ExitCode(IntEnum):
    """The gate's answers: it passed, it blocked, or it could not run as asked."""

    PASS = 0
    BLOCK = 1
    USAGE = 2
    INTERNAL = 3  # the gate's own bug: no verdict; one line on stderr, the traceback in a log file


# Beside the reports (or in the temporary folder when no output folder was known yet).
ERROR_LOG = "traingate-error.log"


DESCRIPTION = """\
traingate runs a PyTorch training repo's tests, smoke-calls its training entrypoint, profiles
the training loop and checks it for concurrency hazards, then answers PASS or BLOCK.
Exit status: 0 PASS, 1 BLOCK, 2 usage or configuration error, 3 internal error of the gate
(its traceback in traingate-error.log beside the reports)."""


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
        help=f"comma-separated stages to run, in this order: {_listed_stages()} (default: all)",
    )
    run.add_argument("--out", type=Path, help="output folder (default: traingate-reports/<task>/<version>)")
    _baseline_options(run)
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the target runs (default: auto = cuda when available)")
    run.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help=f"the CI's policy: a TOML file with the keys of [tool.traingate.policy] (default: ${POLICY_ENV}); "
        "the target's own [policy] may only tighten it",
    )
    run.add_argument(
        "--format",
        dest="formats",
        metavar="LIST",
        help=f"comma-separated outputs: {','.join(FORMATS)} (default: md,json; report.json is always written; "
        "github annotations are also on when GITHUB_ACTIONS=true)",
    )
    loudness = run.add_mutually_exclusive_group()
    loudness.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors and requested annotations")
    loudness.add_argument("--verbose", "-v", action="store_true", help="print progress even when stdout is not a terminal, and each file written")
    sub.add_parser("schema", help="print the JSON Schema of report.json")
    explain = sub.add_parser(
        "explain",
        help="what a finding category (or one of its sub-rules) checks, how it measures, what blocks and how to fix it",
        description="Explain one rule: a finding category, or a sub-rule as SARIF names it (gradscaler-protocol/missing-update). "
        "Without one, list every rule with its stage, when it blocks (policy, never, always) and its one-line description.",
    )
    explain.add_argument("category", nargs="?", help="a category as reports name it (memory-leak), or a rule id (gradscaler-protocol/missing-update)")
    add_merge_and_history(sub)
    add_init(sub)
    return parser


def add_init(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = sub.add_parser(
        "init",
        help="find the repo's training entry point, check a tiny configuration of it and write a commented traingate.toml",
        description="Read the repo's files (never importing them) for its training entry points, propose a tiny configuration "
        "with a step budget, run it under the correctness stage's probes to check that it reaches enough optimizer steps, and "
        "write traingate.toml. What it cannot decide is written as a commented key saying what to fill in. The repo's code is never edited.",
    )
    init.add_argument("target", nargs="?", default=".", help="the repo's root (default: the current folder)")
    init.add_argument("--dry-run", action="store_true", help="print the configuration instead of writing traingate.toml")
    init.add_argument("--no-check", action="store_true", help="do not run the proposed entrypoint (reading the files only)")
    init.add_argument("--budget", type=float, default=120.0, metavar="SECONDS", help="wall budget of one check run (default: 120)")
    init.add_argument("--force", action="store_true", help="overwrite an existing traingate.toml")
    init.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the check runs (default: auto)")


def add_merge_and_history(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    merge = sub.add_parser(
        "merge",
        help="combine stage reports made on different machines into one report and one decision",
        description="Combine the report.json files of one run split across machines (e.g. execution on a CPU runner, "
        "performance and concurrency on a GPU runner); the decision is recomputed from the stage reports.",
    )
    merge.add_argument("reports", nargs="+", type=Path, metavar="REPORT_JSON", help="the parts' report.json files")
    merge.add_argument("--out", type=Path, required=True, help="output folder for the merged reports")
    merge.add_argument("--stages", default=None, help=f"stages the merged report must hold (default: all of {_listed_stages()}); a missing one blocks")
    merge.add_argument("--format", dest="formats", metavar="LIST", help=f"comma-separated outputs: {','.join(FORMATS)} (default: md,json)")
    history = sub.add_parser(
        "history",
        help="one table of a task's versions: decision, score, findings against the previous version, key metrics",
        description="Read DIR/<version>/report.json for every version of a task (e.g. traingate-reports/T035) and print a markdown table and Mermaid charts.",
    )
    history.add_argument("folder", type=Path, metavar="DIR", help="the task's reports folder, one sub-folder per version")
    history.add_argument("--out", type=Path, metavar="FILE", help="write the markdown here instead of stdout")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return dispatch(parser, args)
    except Exception as exc:  # noqa: BLE001 - the gate's own bug: one line and a log, never a bare traceback
        return internal_error(exc, getattr(args, "out_folder", None))


def internal_error(exc: Exception, out: Path | None) -> int:
    """Exit status 3: one line on stderr naming the error and the log file that holds its traceback."""
    log = write_error_log("".join(traceback.format_exception(exc)), out)
    where = f"its traceback is in {display_path(log)}" if log is not None else "its traceback could not be written to a file"
    print(f"traingate: internal error: {type(exc).__name__}: {one_line(str(exc))} (no verdict; {where})", file=sys.stderr)
    return ExitCode.INTERNAL


def write_error_log(text: str, out: Path | None) -> Path | None:
    """The traceback beside the reports, else in the temporary folder; None when neither is writable."""
    candidates = ([out / ERROR_LOG] if out is not None else []) + [Path(tempfile.gettempdir()) / f"traingate-error-{os.getpid()}.log"]
    for path in candidates:
        try:
            path.write_text(text, encoding="utf-8")
        except OSError:
            continue
        return path
    return None


def dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "schema":
        print(json.dumps(PipelineReport.model_json_schema(), indent=2))
        return ExitCode.PASS
    if args.command == "explain":
        return explain_command(args.category)
    if args.command == "merge":
        return merge_command(args)
    if args.command == "history":
        return history_command(args.folder, args.out)
    # Orphans of the stages' processes (double-forked setsid daemons) come back here, not to init.
    become_subreaper()
    command = init_command if args.command == "init" else run_command
    try:
        with interrupt_handling():
            try:
                return command(parser, args)
            except Interrupted as stop:  # cleaned up while a second signal is still ignored
                return interrupted(stop)
    except Interrupted as stop:  # arrived while the handlers were being restored
        return interrupted(stop)
    finally:
        kill_descendants()  # a last sweep before the folder is free for the next run
        release_output()


def _listed_stages() -> str:
    """The registered stages for `--help`; a stage that does not load fails the run itself, with
    a report (`run_command`), not the building of the command line."""
    try:
        return ",".join(stage_names())
    except RegistryError as exc:
        return f"(the registered stages do not load: {exc})"


def explain_command(category: str | None) -> int:
    """`traingate explain [RULE]`: one rule in full, or every rule's one-liner (sub-rules indented)."""
    if category is None:
        width = max(len(rule.id) for rule in rule_table())
        for listed in rule_table():
            shown = f"  {listed.sub}" if listed.sub else listed.id
            print(f"{shown:<{width}}  {listed.stage:<11}  {listed.blocks.value:<6}  {listed.description}")
        return ExitCode.PASS
    rule = rule_table().by_id(category)
    if rule is None:
        print(f"traingate: error: unknown category or rule {category!r} (`traingate explain` lists them)", file=sys.stderr)
        return ExitCode.USAGE
    print(rule_table().explain(rule))
    return ExitCode.PASS


def merge_command(args: argparse.Namespace) -> int:
    """`traingate merge`: refuse parts that do not belong together (exit 2), else write the merged reports."""
    known = stage_names()
    try:
        formats = parse_formats(args.formats)
        requested = parse_stages(args.stages, known)
        parts = [(display_path(path), load_report(path)) for path in args.reports]
        report = merge_reports(parts, requested, list(known))
        out = args.out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        args.out_folder = out  # where an internal error's log goes
        claim_output(out, [s.name for s in report.stages])
    except (UsageError, FormatError, MergeError, OutputBusy) as exc:
        print(f"traingate: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except OSError as exc:
        print(f"traingate: error: --out: cannot write to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        target = Path(report.target.path)
        written = write_reports(report, out, formats, run_facts(target if target.is_dir() else Path.cwd()))
        print(written.annotations, end="", flush=True)
        say_renderer_failures(written)
    finally:
        release_output()
    print_summary(report)
    print(f"Reports: {display_path(out)}")
    return ExitCode.PASS if report.decision.value == "PASS" else ExitCode.BLOCK


def history_command(folder: Path, out: Path | None) -> int:
    """`traingate history DIR`: markdown to stdout, or to `--out`."""
    try:
        text = render_history_md(load_history(folder, history_metrics()))
    except HistoryError as exc:
        print(f"traingate: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if out is None:
        print(text, end="")
        return ExitCode.PASS
    try:
        write_atomic(out, text)
    except OSError as exc:
        print(f"traingate: error: --out: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return ExitCode.USAGE
    return ExitCode.PASS


def _baseline_options(run: argparse.ArgumentParser) -> None:
    """`--baseline`, `--keep` and `--reports`: what a run is judged against (base_revision.py)."""
    run.add_argument(
        "--baseline",
        metavar="REPORT_JSON|REVISION",
        help="what this version is judged against: an earlier report.json, or a git revision of the target (origin/main, a tag, a sha) "
        "whose kept report is used, or which is verified first from a clean tree of that commit (docs/ci.md)",
    )
    run.add_argument(
        "--keep",
        action="store_true",
        help="keep this run's report in --reports as its commit's, for pull requests based on it (a push to the default branch; "
        "kept only when the checkout is that commit with no uncommitted change)",
    )
    run.add_argument(
        "--reports",
        type=Path,
        metavar="DIR",
        help=f"where the reports of baseline revisions are kept, one per commit and task (default: {base_revision.DEFAULT_REPORTS})",
    )


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
    args.out_folder = inputs.out  # where an internal error's log goes
    try:
        claim_output(inputs.out, [*registry, "configuration"])
    except OutputBusy as exc:
        print(f"traingate: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    # Progress is for a person watching a terminal; CI logs get it only with --verbose.
    show_progress = args.verbose or (not args.quiet and sys.stdout.isatty())
    request = RunRequest(
        root=inputs.root, task=inputs.task, version=inputs.version, stages=inputs.stages, out=inputs.out, device=inputs.device,
        baseline=inputs.baseline, baseline_path=inputs.baseline_path,
        baseline_source=inputs.baseline_source,
        observers=[ProgressPrinter()] if show_progress else [], policy=inputs.policy,
    )
    if inputs.baseline_problem is not None:
        print(f"traingate: baseline unavailable: {inputs.baseline_problem}", file=sys.stderr)
        report = baseline_unavailable_report(request, str(args.baseline), inputs.baseline_problem)
        emit_outputs(report, inputs, args)
        if not args.quiet:
            print_summary(report)
        return ExitCode.BLOCK
    if inputs.config_problem is not None or inputs.config is None:
        problem = inputs.config_problem
        assert problem is not None
        print(f"traingate: configuration error: {problem}", file=sys.stderr)
        report = config_error_report(request, problem.file, problem.key, problem.message)
        emit_outputs(report, inputs, args)
        return ExitCode.USAGE
    report = run_pipeline(request, inputs.config, registry)
    emit_outputs(report, inputs, args)
    if args.keep:
        policy_file = ci_policy_path(args.policy)
        store = reports_folder(args, inputs)
        print(f"traingate: {base_revision.keep(inputs.root, inputs.out / 'report.json', store, policy_file.resolve() if policy_file else None)}", file=sys.stderr)
    if not args.quiet:
        print_summary(report)
        print(f"Reports: {display_path(inputs.out)}")
    return ExitCode.PASS if report.decision.value == "PASS" else ExitCode.BLOCK


def init_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`traingate init`: 0 when a configuration was written (or printed), 1 when no training
    entry point was found, 2 on a usage error (an existing configuration without --force)."""
    # Imported here: `traingate run`, the command every CI job starts, never needs it.
    from traingate.pipeline.gate.initializer import CONFIG_NAME, existing_configuration, propose

    root = Path(args.target).resolve()
    if not root.is_dir():
        print(f"traingate: error: {args.target} is not a folder", file=sys.stderr)
        return ExitCode.USAGE
    if not args.budget > 0:
        print("traingate: error: --budget must be a number of seconds above 0", file=sys.stderr)
        return ExitCode.USAGE
    existing = existing_configuration(root)
    if existing is not None and not args.dry_run and not args.force:
        print(f"traingate: error: {existing} already configures traingate; --dry-run prints a proposal, --force writes {CONFIG_NAME} over it", file=sys.stderr)
        return ExitCode.USAGE
    try:
        device = resolve_device(args.device) if not args.no_check else "cpu"
    except UsageError as exc:
        print(f"traingate: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    outcome = propose(root, device=device, check=not args.no_check, budget_s=args.budget)
    if outcome.text is None:
        print("\n".join(outcome.messages))
        return ExitCode.BLOCK
    if args.dry_run:
        print(outcome.text, end="")
        print("\n".join(f"# {line}" for line in outcome.messages))
        return ExitCode.PASS
    write_atomic(root / CONFIG_NAME, outcome.text)
    print("\n".join(outcome.messages))
    if outcome.verified:
        print(f"Wrote {display_path(root / CONFIG_NAME)}; `traingate run {args.target}` verifies the repo with it.")
    else:
        print(f"Wrote {display_path(root / CONFIG_NAME)}, NOT VERIFIED (its `unverified` line says why; `traingate run` repeats it).")
    return ExitCode.PASS


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
    formats: list[str]
    baseline_path: str | None = None
    baseline_source: BaselineSource | None = None  # a revision's: its commit and how its report was had
    baseline_problem: str | None = None  # a revision that gave no baseline: the run is a blocking report saying why


def validate_inputs(args: argparse.Namespace, known_stages: tuple[str, ...]) -> RunInputs:
    """Check the command line, the CI policy and the target's configuration; create `--out`.

    Raises UsageError for anything that makes the run impossible. An invalid target
    configuration is not raised: it is reported (a `config-error` report in `--out`)."""
    root = Path(args.target).resolve()
    stages = parse_stages(args.stages, known_stages)
    try:
        formats = parse_formats(args.formats)
    except FormatError as exc:
        raise UsageError(f"--format: {exc}") from None
    report_given = args.baseline is not None and base_revision.is_report_path(args.baseline)
    baseline = read_baseline(Path(args.baseline)) if report_given else None
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
        config, policy = pin_suite(config.model_copy(update={"policy": effective}), effective, policy)
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
    wanted = (args.out or Path("traingate-reports") / task / version).resolve()
    fresh = not wanted.exists()
    out = prepare_out(wanted, root)
    # Last: where a GPU may be reachable it asks a child interpreter of torch (seconds), so
    # every other usage error is said first.
    try:
        device = resolve_device(args.device)
    except UsageError:
        if fresh:
            with contextlib.suppress(OSError):
                out.rmdir()  # the folder this call made, still empty: a usage error leaves nothing
        raise
    inputs = RunInputs(root, stages, device, baseline, config, config_problem, policy, task, version, out, formats, str(args.baseline) if report_given else None)
    if args.baseline is not None and not report_given:
        _baseline_revision(inputs, args, ci_path)
    return inputs


def reports_folder(args: argparse.Namespace, inputs: RunInputs) -> Path:
    """Where the base commits' reports are kept: `--reports`, else the CI policy's `reports`
    (a target's own is ignored), else the default under the output root."""
    chosen = args.reports or (inputs.config.policy.reports if inputs.config is not None else None)
    return Path(chosen or base_revision.DEFAULT_REPORTS).resolve()


def _baseline_revision(inputs: RunInputs, args: argparse.Namespace, policy_file: Path | None) -> None:
    """`--baseline REVISION`: its kept report, or its commit verified now, before any code of
    this version runs (base_revision.py); a revision that gives none is the run's problem."""
    rerun = ["--stages", ",".join(inputs.stages), "--device", inputs.device]
    store = reports_folder(args, inputs)
    say = None if args.quiet else (lambda text: print(f"traingate: {text}", file=sys.stderr, flush=True))
    found = base_revision.resolve(inputs.root, args.baseline, inputs.task, store, policy_file.resolve() if policy_file else None, rerun, say)
    inputs.baseline_source = BaselineSource(revision=found.revision, commit=found.commit, how=found.source, note=found.note or found.problem or "")
    if found.report is None:
        inputs.baseline_problem = found.problem or "the baseline revision gave no report"
        return
    inputs.baseline, inputs.baseline_path = found.report, found.path


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
    shown = display_path(out)
    if out == root:
        raise UsageError(f"--out: {shown} is the target's root; reports would overwrite the target's files")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {shown} exists and is not a folder")
    if out.is_relative_to(root) and out.is_dir() and any(out.iterdir()) and not _earlier_output(out):
        raise UsageError(f"--out: {shown} is a folder of the target with its own files; choose a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise UsageError(f"--out: cannot write to {shown}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"--out: cannot write to {shown}: permission denied")
    return out


def resolve_device(choice: str) -> str:
    if choice == "cpu":
        return choice
    facts = torch_facts()  # this process never imports torch (pipeline/gate/torch_probe.py)
    if choice == "cuda" and not facts.cuda:
        raise UsageError("--device cuda: no CUDA device is available here" + (f" ({facts.problem})" if facts.problem else ""))
    return "cuda" if facts.cuda else "cpu"


def default_version(root: Path) -> str:
    return rev_parse(root, "--short", "HEAD") or "local"


def emit_outputs(report: PipelineReport, inputs: RunInputs, args: argparse.Namespace) -> None:
    """Write the reports `--format` asks for; print annotations (stdout is what GitHub reads them from)."""
    facts = run_facts(inputs.root)
    written = write_reports(report, inputs.out, inputs.formats, facts)
    print(written.annotations, end="", flush=True)
    say_renderer_failures(written)
    if args.verbose:
        base = display_path(repository_root(inputs.root) or inputs.root)
        print(f"Paths in CI outputs are relative to {'the current folder' if str(base) == '.' else base}")
        for path in written.files:
            print(f"Wrote {display_path(path)}")
        if written.step_summary is not None:
            print(f"Appended a summary to {display_path(written.step_summary)}")


def print_summary(report: PipelineReport) -> None:
    """The terminal summary; if its renderer fails, the decision and score on one line instead."""
    try:
        print(render_summary(report), end="")
    except Exception as exc:  # noqa: BLE001 - a renderer bug must not cost the decision's exit status
        print(f"traingate: error: the terminal summary renderer failed ({type(exc).__name__}: {one_line(str(exc))})", file=sys.stderr)
        print(f"Decision: {report.decision.value}  score {report.score}/100")


def say_renderer_failures(written: Written) -> None:
    """One line on stderr per renderer that failed; the exit status stays the decision's."""
    for output, why in written.failures:
        minimal = "; report.md is a minimal report that says so" if written.minimal_md else ""
        print(f"traingate: error: the {output} renderer failed ({one_line(why)}); report.json and the other outputs were written{minimal}", file=sys.stderr)


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

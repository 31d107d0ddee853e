"""`traingate init [PATH]`: find the repo's training, propose a tiny configuration, check
that it reaches enough optimizer steps, and write a commented `traingate.toml`.

The check runs the proposed entrypoint as `traingate run --stages correctness` would (the
registered stage that reports the optimizer steps it observed): on a
snapshot of the target, in a stage agent and its child processes under the probes, within
`--budget` seconds. The repo's code is never imported here, and never edited: the only file
written is `traingate.toml` (with `--dry-run`, not even that).
"""

from __future__ import annotations

from pathlib import Path

from traingate.pipeline.gate.init_check import CheckResult, InitOutcome, check_run, missing_package
from traingate.pipeline.gate.init_propose import ENOUGH_STEPS, Candidate, candidates
from traingate.pipeline.gate.init_scan import Found, is_test, is_test_path, scan
from traingate.pipeline.gate.init_tests import observe_tests
from traingate.pipeline.gate.init_toml import check_written, enabled, render
from traingate.pipeline.model.registry import step_checking_stage
from traingate.pipeline.model.tomlcompat import tomllib

CONFIG_NAME = "traingate.toml"
# Candidates tried in the check, best first, when the one before did not reach enough steps.
MAX_TRIES = 3


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
    if any(is_test(f) for f in found.training()):
        # The tests train: the gate observes what they run. An entrypoint would turn that off.
        return observe_tests(root, found, listed, device=device, check=check, budget_s=budget_s)
    listed = [c for c in listed if c.kind != "test"]
    if not listed:
        return InitOutcome(None, None, None, nothing_found(found))
    chosen, result, tried = listed[0], None, list[str]()
    if check:
        chosen, result, tried = checked_choice(root, listed, device, budget_s)
    verified = result is not None and result.enough
    unverified = None if verified else not_verified(chosen, result)
    # Only what the check ran is written to run: anything else waits, commented out, for the
    # user; till then `traingate run` runs as with no configuration, never worse.
    active = verified or (not check and chosen.runnable)
    header = header_lines(chosen, result, listed, found) + [f"Also tried: {line}" for line in tried]
    text = render(chosen, header, tests_line(found), active=active, unverified=unverified)
    messages = terminal_lines(chosen, result, listed) + [f"Also tried: {line}" for line in tried]
    if not active:
        messages.append("NOT VERIFIED: the [entrypoint] is written commented out; `traingate run` runs as with no configuration, and says so, until it is filled in and uncommented.")
    invalid = check_written(text, root)
    if invalid is not None:
        messages.append(f"The file as written does not load: {invalid}")
    elif not active and (invalid := check_written(enabled(text), root)) is not None:
        messages.append(f"Uncommented before its FILL IN lines are filled, `traingate run` stops at a configuration error: {invalid}")
    return InitOutcome(text, chosen, result, messages, verified=verified)


def not_verified(chosen: Candidate, result: CheckResult | None) -> str:
    """The `unverified` line: why the check did not verify the proposal."""
    if result is None:
        return f"{chosen.label} was not checked: " + ("its FILL IN values are missing" if not chosen.runnable else "--no-check was given")
    return f"{chosen.label}: {check_line(result, chosen)}"[:500]


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
        if missing_package(result) and first is None:
            return candidate, result, tried[:-1]  # the best one, right once the package is installed
        first = first or (candidate, result)
    unfilled = next((c for c in listed if not c.runnable), None)
    if unfilled is not None:
        return unfilled, None, tried
    return (first[0], first[1], tried[1:]) if first is not None else (listed[0], None, tried)


def check_line(result: CheckResult | None, chosen: Candidate) -> str:
    if result is None:
        return "Not checked: " + ("the FILL IN lines must be filled first." if not chosen.runnable else "--no-check was given.")
    if result.enough:
        line = f"Checked: it reached {result.steps} optimizer steps in {result.duration_s:.0f} s under the {step_checking_stage()} stage's probes."
        return line + (f" That run also found {result.findings} finding(s): `traingate run` reports them." if result.findings else "")
    if result.problems:
        return "The check run fell short: " + "; ".join(result.problems)
    return f"The check run reached {result.steps or 0} optimizer steps, fewer than the {ENOUGH_STEPS} the performance stage measures: raise max_batches, or the epochs or steps in args/kwargs."


def entry_line(chosen: Candidate, result: CheckResult | None) -> str:
    """What the file says it runs: a claim the check observed, or one read from the files only."""
    if result is not None and result.enough:
        return f"Training entry point: {chosen.label} ({chosen.where}): {chosen.why}."
    return f"Proposed training entry point, NOT VERIFIED: {chosen.label} ({chosen.where}); read from the files: {chosen.why}."


def header_lines(chosen: Candidate, result: CheckResult | None, listed: list[Candidate], found: Found) -> list[str]:
    lines = [
        "traingate's configuration, written by `traingate init` (each key: docs/configuration.md).",
        entry_line(chosen, result),
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
    lines = [entry_line(chosen, result), check_line(result, chosen)]
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


def tests_line(found: Found) -> str | None:
    """`tests`: left out (what pytest collects by its own rules) where the repo has test files;
    else `false` (no suite)."""
    if any(is_test_path(f.path) for f in found.functions):
        return None
    return "tests = false   # no test files found: the execution stage runs no suite"

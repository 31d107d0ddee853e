"""With a baseline, the baseline's verification is the floor (docs/configuration.md).

The change under review writes the gate's configuration in its own tree. So, with a
`--baseline` whose report records its commit, the gate reads the baseline's configuration and
waivers from git at that commit (`baseline_config`), compares them with the change's
(`config_diff`) and reports, in a `configuration` section of the report and stage:

- each difference that narrows what is verified: a blocking `verification-narrowed` with both
  values side by side (info, `verification-narrowed/accepted`, where the CI policy sets
  `allow_config_changes = true`);
- where the entrypoint's configuration differs, the baseline's entrypoint is smoke-called on
  this version as well (the execution stage's `baseline_entrypoint`); where the files say it no
  longer applies (renamed with its callers), its differences do not block by themselves, and
  its call stopping at the renamed name is the execution stage's
  `verification-narrowed/interface-changed`, medium;
- each waiver the change added that matched a finding (`needs-approval`; the finding still blocks).

Everything here runs in the gate's process and reads files; nothing of the target is imported.
"""

from __future__ import annotations

import difflib
import json
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traingate.pipeline.gate.baseline_config import BaselineSettings, NotCompared, inline_key, read_baseline_settings, read_files_at
from traingate.pipeline.gate.config_diff import NARROWS, WIDENS, Difference, baseline_entrypoint_gone, differences
from traingate.pipeline.gate.waivers import NEEDS_APPROVAL, AddedWaivers
from traingate.pipeline.model.config import EntrypointConfig, TargetConfig
from traingate.pipeline.model.findings import finding as make_finding
from traingate.pipeline.model.schema import (
    Category,
    ConfigChange,
    Evidence,
    EvidenceKind,
    Finding,
    Location,
    PipelineReport,
    VerificationReview,
    WaiverEntry,
)

# The report's stage of the gate's own findings on the configuration (a config-error report's too).
CONFIGURATION_STAGE = "configuration"
STAGE = CONFIGURATION_STAGE
NOT_COMPARED_RULE = "verification-narrowed/not-compared"
ACCEPTED_RULE = "verification-narrowed/accepted"
NOT_COMPARED_NOTE = "No --baseline: the gate configuration and the waivers are the change's own and were not compared with a baseline's."
_MAX_DIFF_CHARS = 6000


@dataclass
class Review:
    """What the gate found before the stages ran, and what it asks them to run."""

    settings: BaselineSettings | NotCompared | None  # None: no baseline
    current_file: str | None
    changes: list[ConfigChange] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    baseline_entrypoint: EntrypointConfig | None = None  # smoke-called on this version too
    # The setup module the configuration names, in the baseline's form (path -> text), where the
    # change edited it: its training is observed again with it (the correctness stage).
    baseline_setup: dict[str, str] = field(default_factory=dict)

    @property
    def baseline(self) -> BaselineSettings | None:
        return self.settings if isinstance(self.settings, BaselineSettings) else None


def review(root: Path, baseline: PipelineReport | None, config: TargetConfig) -> Review:
    current_file = config.config_file
    if baseline is None:
        return Review(None, current_file)
    settings = read_baseline_settings(root, baseline.target.commit)
    if isinstance(settings, NotCompared):
        return Review(settings, current_file, findings=[_not_compared(settings, config)])
    found = differences(settings.config, settings.file, config, current_file, pinned_suite=config.policy.tests is not None)
    result = Review(settings, current_file)
    base_ep = settings.config.entrypoint
    entry = [d for d in found if d.key.startswith("entrypoint")]
    gone = _gone(root, base_ep) if base_ep is not None and entry else None
    accepted = config.policy.allow_config_changes
    for diff in found:
        action = _action(diff, accepted, gone if diff in entry else None)
        result.changes.append(ConfigChange(key=diff.key, baseline=diff.baseline, current=diff.current, effect=diff.effect, action=action))
        if diff.effect == NARROWS and not (gone and diff in entry):
            result.findings.append(_narrowed(diff, settings, config, accepted))
    # Run even where the files say it is gone: its call on this version is the observed evidence
    # of the interface change (the execution stage's verification-narrowed/interface-changed).
    if base_ep is not None and entry and not accepted:
        result.baseline_entrypoint = base_ep
    if base_ep is not None and not accepted:
        result.baseline_setup = edited_setup(root, settings.commit, base_ep, config.entrypoint)
    return result


def edited_setup(root: Path, commit: str, base: EntrypointConfig, current: EntrypointConfig | None) -> dict[str, str]:
    """The setup module both configurations name, in the baseline's form, where this version's
    differs from it (path -> the baseline's text); empty where there is none or it is unchanged."""
    if not base.setup or current is None or current.setup != base.setup:
        return {}
    module = base.setup.split(":", 1)[0].replace(".", "/")
    for path in (f"{module}.py", f"{module}/__init__.py"):
        try:
            [text] = read_files_at(root, commit, [path])
        except (OSError, subprocess.TimeoutExpired, ValueError, UnicodeDecodeError):
            return {}
        if text is None:
            continue
        mine = root / path
        try:
            changed = not mine.is_file() or mine.read_text(encoding="utf-8", errors="replace") != text
        except OSError:
            changed = True
        return {path: text} if changed else {}
    return {}


def _gone(root: Path, ep: EntrypointConfig) -> str | None:
    try:
        return baseline_entrypoint_gone(root, ep)
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # unreadable here: its smoke call will tell


def _action(diff: Difference, accepted: bool, gone: str | None) -> str:
    if diff.effect == WIDENS:
        return "listed: it widens what is verified"
    if diff.effect != NARROWS:
        return "listed"
    if gone is not None:
        return f"interface changed ({gone}): not blocking by itself; the baseline's entrypoint is smoke-called on this version"
    return "accepted by the CI policy (allow_config_changes)" if accepted else "blocks"


def _where(settings: BaselineSettings, config: TargetConfig) -> Location:
    return Location(path=config.config_file or settings.file or "pyproject.toml")


def _evidence(summary: str, diffs: list[Difference], settings: BaselineSettings, config: TargetConfig) -> Evidence:
    data: dict[str, Any] = {
        "baseline_commit": settings.commit,
        "baseline_file": settings.file,
        "current_file": config.config_file,
        "changes": [{"key": d.key, "baseline": d.baseline, "current": d.current, "effect": d.effect} for d in diffs],
        "diff": config_diff_text(settings, config),
    }
    return Evidence(kind=EvidenceKind.OBSERVED, summary=summary[:300], data=data)


def _narrowed(diff: Difference, settings: BaselineSettings, config: TargetConfig, accepted: bool) -> Finding:
    side = f"baseline ({settings.commit[:12]}): {_shown(diff.baseline)}; this change: {_shown(diff.current)}"
    return make_finding(
        stage=STAGE, category=Category.VERIFICATION_NARROWED, rule=ACCEPTED_RULE if accepted else None, key=diff.key,
        title=f"The change narrowed how it is verified: `{diff.key}` — {side}"[:300],
        location=_where(settings, config),
        problem=(
            f"`{diff.key}` differs from the baseline's gate configuration ({settings.file or 'no configuration file: the defaults'} "
            f"at commit {settings.commit[:12]}): {side}. {_why(diff)}"
            + (" The CI policy accepts configuration changes (allow_config_changes = true)." if accepted else "")
        ),
        evidence=_evidence(side, [diff], settings, config),
        block_on=config.policy.block_on,
    )


def _why(diff: Difference) -> str:
    if diff.key == "tests":
        return "The suite the gate runs is the change's choice: fewer or other tests, or options that select, run than in the baseline."
    if diff.key.startswith("entrypoint"):
        return "The gate would smoke-call, profile and check another function, script or arguments than the baseline's: what users run may not be what is checked."
    return "A check or its budget is narrower than the baseline's."


def _not_compared(settings: NotCompared, config: TargetConfig) -> Finding:
    return make_finding(
        stage=STAGE, category=Category.VERIFICATION_NARROWED, rule=NOT_COMPARED_RULE, key="not-compared",
        title=f"The gate configuration was not compared with the baseline's: {settings.reason}"[:300],
        location=None,
        problem=f"The baseline's gate configuration and waivers could not be read: {settings.reason}. Whether the change narrowed how it is verified, or waived its own findings, was not checked; its configuration and waivers were used as they are.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=settings.reason[:300], data={"commit": settings.commit, "reason": settings.reason}),
        block_on=config.policy.block_on,
    )


def added_waivers(root: Path, result: Review, config: TargetConfig) -> AddedWaivers | None:
    """The waivers of this version the baseline's tree did not have; None: not compared."""
    settings = result.baseline
    if settings is None:
        return None
    table = frozenset(n for n, w in enumerate(config.waive, start=1) if not settings.has_waiver(w))
    left = Counter(settings.inline)
    inline = set()
    for waiver in config.inline_waivers:
        key = inline_key(root, waiver)
        if left[key] > 0:
            left[key] -= 1
        else:
            inline.add((waiver.path, waiver.line))
    return AddedWaivers(config=table, inline=frozenset(inline))


def waiver_findings(entries: list[WaiverEntry], config: TargetConfig) -> list[Finding]:
    """A blocking finding for each waiver the change added that matched a finding."""
    found = []
    for entry in entries:
        if entry.status != NEEDS_APPROVAL:
            continue
        what = entry.id or f"{', '.join(entry.categories)} at {entry.path}{f':{entry.line}' if entry.line else ''}"
        where = Location(path=entry.path, line=entry.line) if entry.source == "inline" and entry.path else Location(path=config.config_file or "pyproject.toml")
        found.append(make_finding(
            stage=STAGE, category=Category.VERIFICATION_NARROWED, key=f"waiver:{entry.origin}",
            title=f"The change waives its own finding(s): {entry.origin} ({what}) — baseline: no such waiver"[:300],
            location=where,
            problem=(
                f"The waiver {entry.origin} ({what}: \"{entry.reason}\") is not in the baseline's tree: the change under review added it, "
                f"and it matched {len(entry.matched)} finding(s) ({', '.join(entry.matched[:10])}). A change does not waive its own "
                "findings: they block, and the waiver needs approval (the CI policy's allow_new_waivers = true, for a trusted pull request)."
            ),
            evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"baseline: none; this change: {entry.origin}"[:300], data={"baseline": None, "current": entry.model_dump(mode="json")}),
            block_on=config.policy.block_on,
        ))
    return found


def summary(result: Review, waivers: list[WaiverEntry]) -> VerificationReview:
    settings = result.settings
    if settings is None:
        return VerificationReview(compared=False, note=NOT_COMPARED_NOTE, current_file=result.current_file)
    if isinstance(settings, NotCompared):
        return VerificationReview(compared=False, note=f"Not compared with the baseline's: {settings.reason}.", baseline_commit=settings.commit, current_file=result.current_file)
    ep = result.baseline_entrypoint
    return VerificationReview(
        compared=True, baseline_commit=settings.commit, baseline_file=settings.file, current_file=result.current_file,
        changes=result.changes, new_waivers=[w for w in waivers if w.added], baseline_entrypoint=ep.label if ep is not None else None,
    )


def config_diff_text(settings: BaselineSettings, config: TargetConfig) -> str:
    """The unified diff of the two configurations as the gate read them (defaults filled in)."""
    def shown(c: TargetConfig) -> list[str]:
        return json.dumps(c.model_dump(mode="json", exclude={"policy", "waive"}), indent=1, sort_keys=True, default=str).splitlines(keepends=True)

    lines = difflib.unified_diff(shown(settings.config), shown(config), fromfile=f"{settings.file or '(defaults)'} at {settings.commit[:12]}", tofile=config.config_file or "(defaults)")
    return "".join(lines)[:_MAX_DIFF_CHARS]


def _shown(value: Any) -> str:
    return "not set" if value is None else json.dumps(value, default=str)



def unverified_findings(config: TargetConfig) -> list[Finding]:
    """The `unverified` line `traingate init` writes where its check run fell short, repeated
    as an info finding: a configuration is never taken as verified where init could not run it."""
    if not config.unverified:
        return []
    return [make_finding(
        stage=STAGE, category=Category.UNVERIFIED_CONFIGURATION, key="unverified",
        title=f"traingate init could not verify this configuration: {config.unverified}"[:300],
        location=Location(path=config.config_file or "traingate.toml"),
        problem=(
            f"{config.config_file or 'The configuration'} says, in its `unverified` key written by `traingate init`: {config.unverified}. "
            "What init could not run is left commented out in the file; the stages ran with the rest."
        ),
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=config.unverified[:300], data={"unverified": config.unverified}),
        block_on=config.policy.block_on,
    )]

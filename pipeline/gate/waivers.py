"""Waivers and the new-findings rule: which findings the gate accepts without blocking.

Both are decided here, in the gate's own process, after a stage's outcome has been checked:
a stage (and the target's code under it) can neither waive a finding nor see its waivers.

- A waiver comes from the target's configuration (`[[tool.traingate.waive]]`: a finding id, or
  a category at a path, with a reason and an optional expiry date) or from an inline comment
  on the flagged line (`# traingate: ignore[host-sync] reason`). A waived finding stays in
  the report, marked with the waiver, and does not block.
- The target's configuration is part of the change under review, so the CI can switch
  waivers off (`allow_waivers = false` in its policy file), and integrity failures of the
  gate itself (`NEVER_WAIVABLE`) are never accepted, by a waiver or by the baseline.
- `policy.block = "new"` with a baseline: a finding whose id the baseline already had is
  shown as persisting and does not block.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path, PurePosixPath
from typing import Any

from traingate.pipeline.model.config import NEVER_WAIVABLE, TargetConfig, WaiverConfig
from traingate.pipeline.gate.config_file import ConfigError
from traingate.pipeline.model.schema import Acceptance, Category, Finding, PipelineReport, WaiverEntry, WaiverMark
from traingate.pipeline.model.registry import rule_table

# `# traingate: ignore[host-sync, memory-leak] the reason`
_INLINE = re.compile(r"#\s*traingate:\s*ignore\[(?P<categories>[^\]]*)\]\s*(?P<reason>.*)$")
# What every inline waiver's line holds (`git grep` finds the baseline's by it).
INLINE_MARKER = "traingate:"
# Folders that hold no code of the target's own (the same ones the stages' copies leave out).
_NOT_SCANNED = frozenset({".git", "__pycache__", ".venv", "venv", "node_modules", "traingate-reports", "site-packages"})
_LARGEST_SCANNED_BYTES = 2 * 2**20

APPLIED = "applied"
UNUSED = "unused"
EXPIRED = "expired"
REFUSED = "refused"
DISALLOWED = "disallowed"


@dataclass(frozen=True)
class InlineWaiver:
    """A `# traingate: ignore[...]` comment: it waives those categories on its own line."""

    path: str  # relative to the target root, posix
    line: int
    categories: tuple[Category, ...]
    reason: str


def scan_inline_waivers(root: Path) -> list[InlineWaiver]:
    """Every inline waiver in the target's Python files; ConfigError for one without a reason
    or naming an unknown or unwaivable category. Only real comments count, never strings."""
    found: list[InlineWaiver] = []
    for file in sorted(_python_files(root)):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if "traingate:" not in text:
            continue
        rel = file.relative_to(root).as_posix()
        for line, comment in _comments(text):
            match = _INLINE.search(comment)
            if match is not None:
                found.append(_inline_waiver(rel, line, match))
    return found


def inline_categories(line: str) -> tuple[str, ...] | None:
    """The category names an inline waiver on this line names, sorted; None: no waiver."""
    match = _INLINE.search(line)
    return tuple(sorted(n.strip() for n in match["categories"].split(","))) if match is not None else None


def _python_files(root: Path) -> list[Path]:
    files: list[Path] = []
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink():
                continue
            if entry.is_dir():
                if entry.name not in _NOT_SCANNED and not entry.name.startswith("."):
                    pending.append(entry)
            elif entry.suffix == ".py" and entry.stat().st_size <= _LARGEST_SCANNED_BYTES:
                files.append(entry)
    return files


def _comments(text: str) -> list[tuple[int, str]]:
    try:
        return [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        # Unparseable file: fall back to lines whose first `#` starts the marker.
        return [(n, line[line.index("#"):]) for n, line in enumerate(text.splitlines(), start=1) if "#" in line]


def _inline_waiver(rel: str, line: int, match: re.Match[str]) -> InlineWaiver:
    where = f"line {line}"
    known = {c.value: c for c in rule_table().categories()}
    categories: list[Category] = []
    for name in (n.strip() for n in match["categories"].split(",")):
        if name not in known:
            raise ConfigError(rel, where, f"inline waiver: unknown category {name!r} (`traingate explain` lists them)")
        if known[name] in NEVER_WAIVABLE:
            raise ConfigError(rel, where, f"inline waiver: {name} findings cannot be waived")
        categories.append(known[name])
    reason = match["reason"].strip()
    if not reason:
        raise ConfigError(rel, where, "inline waiver: a waiver needs a reason after ignore[...]: say why the finding is accepted")
    return InlineWaiver(path=rel, line=line, categories=tuple(categories), reason=reason)


@dataclass(frozen=True)
class AddedWaivers:
    """Which of this version's waivers its baseline's tree did not have (`verification`): the
    entries of its `[[waive]]` table by position (from 1), its inline waivers by file and line."""

    config: frozenset[int] = frozenset()
    inline: frozenset[tuple[str, int]] = frozenset()


NEEDS_APPROVAL = "needs-approval"


@dataclass
class _Rule:
    """One waiver and what it matched in this run."""

    entry: WaiverEntry
    expires: date | None
    matched: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    added: bool | None = None  # the change under review added it; None: not compared

    def matches(self, finding: Finding) -> bool:
        e = self.entry
        if e.id is not None:
            return finding.id == e.id
        loc = finding.location
        if loc is None or finding.category.value not in e.categories or _norm(loc.path) != _norm(e.path or ""):
            return False
        return (e.line is None or loc.line == e.line) and (e.function is None or loc.function == e.function)

    def expired(self, today: date) -> bool:
        return self.expires is not None and self.expires < today


def _norm(path: str) -> str:
    return PurePosixPath(path.replace("\\", "/")).as_posix().removeprefix("./")


class Adjudicator:
    """Applies waivers and the new-findings rule to each stage's findings, then sums them up."""

    def __init__(self, config: TargetConfig, baseline: PipelineReport | None, today: date, added: AddedWaivers | None = None) -> None:
        self.today = today
        self.allowed = config.policy.allow_waivers
        # A waiver the change added applies only where the CI allows new waivers (docs/configuration.md).
        self.new_allowed = config.policy.allow_new_waivers
        self.requested_block = config.policy.block
        self.baseline_ids: set[str] | None = None
        if baseline is not None:
            self.baseline_ids = {f.id for s in baseline.stages for f in s.findings}
        self.rules = [*_config_rules(config), *_inline_rules(config.inline_waivers)]
        if added is not None:
            for number, rule in enumerate(self.rules, start=1):
                e = rule.entry
                rule.added = number in added.config if e.source == "config" else (e.path or "", e.line or 0) in added.inline
        self.held_back: list[str] = []

    @property
    def block_new(self) -> bool:
        return self.requested_block == "new" and self.baseline_ids is not None

    def apply(self, findings: list[Finding]) -> list[Finding]:
        return [self._judge(f) for f in findings]

    def _judge(self, finding: Finding) -> Finding:
        update: dict[str, Any] = {}
        if self.baseline_ids is not None:
            update["baseline_status"] = "persisting" if finding.id in self.baseline_ids else "new"
        mark = self._waiver_for(finding)
        if mark is not None:
            update.update(waived=mark, blocking=False)
        elif finding.blocking and self.block_new and finding.id in (self.baseline_ids or set()) and finding.category not in NEVER_WAIVABLE:
            update["blocking"] = False
            self.held_back.append(finding.id)
        return finding.model_copy(update=update) if update else finding

    def _waiver_for(self, finding: Finding) -> WaiverMark | None:
        chosen: WaiverMark | None = None
        for rule in self.rules:
            if not rule.matches(finding):
                continue
            if finding.category in NEVER_WAIVABLE:
                rule.refused.append(finding.id)
                continue
            rule.matched.append(finding.id)
            if chosen is None and self.allowed and not rule.expired(self.today) and self._may_apply(rule):
                e = rule.entry
                chosen = WaiverMark(reason=e.reason, source=e.source, origin=e.origin, expires=e.expires)
        return chosen

    def _may_apply(self, rule: _Rule) -> bool:
        return not rule.added or self.new_allowed

    def summary(self) -> Acceptance:
        return Acceptance(
            block="new" if self.block_new else "all",
            block_note=self._block_note(),
            waivers_allowed=self.allowed,
            waivers=[self._settled(rule) for rule in self.rules],
        )

    def _block_note(self) -> str:
        if self.requested_block != "new":
            return ""
        if not self.block_new:
            return 'policy.block = "new" but no --baseline was given: every finding blocks, as with "all"'
        return f'policy.block = "new": only findings whose id is not in the baseline block; {len(self.held_back)} persisting finding(s) shown, not blocking'

    def _settled(self, rule: _Rule) -> WaiverEntry:
        if not self.allowed:
            status, note = DISALLOWED, "the CI policy sets allow_waivers = false: waivers are listed, not applied"
        elif rule.expired(self.today):
            status, note = EXPIRED, f"expired on {rule.entry.expires}: it no longer applies" + (
                f"; {len(rule.matched)} finding(s) it matched count again" if rule.matched else ""
            )
        elif rule.matched and not self._may_apply(rule):
            status, note = NEEDS_APPROVAL, (
                f"added by this change ({rule.entry.origin}), not in the baseline's tree: a change does not waive its own findings; "
                f"the {len(set(rule.matched))} finding(s) it matched block. It applies when the CI policy sets allow_new_waivers = true"
            )
        elif rule.matched:
            status, note = APPLIED, ""
        elif rule.refused:
            status, note = REFUSED, "it matches only findings that cannot be waived (target-modified, stage-error, hang, leftover-process, environment)"
        else:
            status, note = UNUSED, "it matched no finding in this run"
        return rule.entry.model_copy(update={"status": status, "matched": sorted(set(rule.matched)), "note": note, "added": rule.added})


def _config_rules(config: TargetConfig) -> list[_Rule]:
    file = config.config_file or "pyproject.toml"
    table = "[[waive]]" if file == "traingate.toml" else "[[tool.traingate.waive]]"
    return [_Rule(entry=_config_entry(w, f"{file} {table} #{n}"), expires=w.expires) for n, w in enumerate(config.waive, start=1)]


def _config_entry(waiver: WaiverConfig, origin: str) -> WaiverEntry:
    return WaiverEntry(
        origin=origin,
        source="config",
        id=waiver.id,
        categories=[waiver.category.value] if waiver.category else [],
        path=_norm(waiver.path) if waiver.path else None,
        line=waiver.line,
        function=waiver.function,
        reason=waiver.reason,
        expires=waiver.expires.isoformat() if waiver.expires else None,
        status=UNUSED,
    )


def _inline_rules(inline: list[InlineWaiver]) -> list[_Rule]:
    return [
        _Rule(
            entry=WaiverEntry(
                origin=f"{w.path}:{w.line}",
                source="inline",
                categories=[c.value for c in w.categories],
                path=w.path,
                line=w.line,
                reason=w.reason,
                status=UNUSED,
            ),
            expires=None,
        )
        for w in inline
    ]

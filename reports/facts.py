"""The few facts about a run that CI outputs need besides the report itself.

The writers stay pure functions of the report: the gate works these facts out (where the target
sits in its repository, which file configures it, the rule table) and hands them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from posixpath import join as posix_join
from posixpath import normpath

from pydantic import BaseModel

from traingate.pipeline.model.rules import Rule
from traingate.pipeline.model.schema import Finding, Severity


@dataclass(frozen=True)
class StagePage:
    """How a stage's page is rendered: the model its template reads `details` as (None: the
    plain dict) and its template file (None: the generic `stage.md.j2`). The gate hands them in
    from the registered stages (`Stage.details_model`, `Stage.template`)."""

    details_model: type[BaseModel] | None = None
    template: Path | None = None


@dataclass(frozen=True)
class RunFacts:
    # The target's root relative to its repository's root, "/"-separated; "" when the target
    # is the repository's root or not in a repository (paths are then relative to the target).
    target_prefix: str = ""
    # The configuration file, relative to the target's root (None: the target has none).
    config_file: str | None = None
    rules: tuple[Rule, ...] = ()  # the rule table (`traingate.pipeline.model.rules.table`)
    pages: Mapping[str, StagePage] = field(default_factory=dict)  # each stage's page, by its name

    def repo_path(self, path: str) -> str:
        """A finding's path (relative to the target) made relative to the repository's root."""
        if path.startswith("/") or not self.target_prefix:
            return path
        return normpath(posix_join(self.target_prefix, path))

    def anchor_file(self) -> str | None:
        """Where a finding without a location is shown: the configuration file, if any."""
        return self.repo_path(self.config_file) if self.config_file else None

    def target_folder(self) -> str:
        """The target's root as a repository-relative folder ("." for the root itself)."""
        return self.target_prefix or "."

    def categories_of(self, stage: str) -> list[str]:
        return [rule.category.value for rule in self.rules if rule.stage == stage and not rule.sub]


def location_text(finding: Finding, facts: RunFacts) -> str:
    """`path:line` relative to the repository's root, or `-` for a finding without a place."""
    loc = finding.location
    if loc is None:
        return "-"
    return facts.repo_path(loc.path) + (f":{loc.line}" if loc.line else "")


def worst_first(findings: list[Finding]) -> list[Finding]:
    """Blocking findings first, then by severity, category and place."""
    return sorted(findings, key=lambda f: (not f.blocking, *f.sort_key()))


def is_serious(severity: Severity) -> bool:
    return severity.rank <= Severity.MEDIUM.rank

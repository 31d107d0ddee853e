"""Warnings the tests and the smoke call raised, and the deprecated PyTorch APIs among them.

`deprecated-api`: a deprecation warning that comes from torch (`torch.cuda.amp.autocast(...)`,
`torch.cuda.amp.GradScaler(...)`, ...), located at the target's calling line. Observed
(the warning was raised while the code ran), low severity and never blocking: the code
works today and stops working in a later PyTorch.
"""

from __future__ import annotations

import re

import linecache
from dataclasses import dataclass, field
from pathlib import Path
from traingate.stages.execution.details import WarningRow
from traingate.pipeline.model.findings import locations_data
from traingate.pipeline.model.schema import LOCATIONS_KEY, Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext
from traingate.stages.contract.messages import WarningRecord
from traingate.stages.contract.pytest_events import WarningEvent
from traingate.stages.execution.rules import DEPRECATED_API

_DEPRECATION = ("DeprecationWarning", "PendingDeprecationWarning")


_TORCH_NAMED = re.compile(r"(?<![\w.])torch\b(?!_)")


@dataclass
class WarningSite:
    """One warning message at one place, however often it was raised."""

    category: str
    message: str
    path: str | None  # the target's line that led to it, relative to the target root
    line: int | None
    function: str | None
    code: str
    via_torch: bool
    sources: set[str] = field(default_factory=set)  # "tests", "smoke"
    count: int = 0
    issued_at: str = ""  # where warnings.warn attributed it

    @property
    def deprecated_torch_api(self) -> bool:
        deprecation = self.category in _DEPRECATION or "deprecat" in self.message.lower()
        # `torch` as a name of its own: `pytorch_lightning` (or `torch_xla`) in a message is another package's.
        return deprecation and (self.via_torch or _TORCH_NAMED.search(self.message) is not None or "/torch/" in self.issued_at)

    def row(self) -> WarningRow:
        return WarningRow(
            category=self.category,
            message=self.message[:500],
            location=f"{self.path}:{self.line}" if self.path else self.issued_at,
            code=self.code,
            sources=sorted(self.sources),
            count=self.count,
            deprecated_torch_api=self.deprecated_torch_api,
        )


def gather(root: Path, test_warnings: list[WarningEvent], smoke_warnings: list[WarningRecord]) -> list[WarningSite]:
    """Merge the plugin's and the harness's warning records into one site per place+message."""
    sites: dict[tuple[str, str, str | None, int | str | None], WarningSite] = {}
    records: list[tuple[str, WarningEvent | WarningRecord]] = [("tests", w) for w in test_warnings] + [("smoke", w) for w in smoke_warnings]
    for source, record in records:
        frame = record.target_frame
        path, line = (frame.path, frame.line) if frame is not None else (None, None)
        key = (record.category, record.message, path, line if path else record.filename)
        site = sites.get(key)
        if site is None:
            code = (frame.code if frame is not None else "") or (linecache.getline(str(root / path), int(line)).strip() if path and line else "")
            site = sites[key] = WarningSite(
                category=record.category,
                message=record.message,
                path=path,
                line=line,
                function=frame.function if frame is not None else None,
                code=code,
                via_torch=isinstance(record, WarningEvent) and record.via_torch,
                issued_at=f"{record.filename}:{record.lineno}",
            )
        site.sources.add(source)
        # The harness counts repeats of a record; the plugin sends one event per warning.
        site.count += record.count if isinstance(record, WarningRecord) else 1
    return list(sites.values())


def deprecated_api_findings(ctx: StageContext, sites: list[WarningSite]) -> list[Finding]:
    """One finding per deprecation (a warning's category and message: one cause, one fix),
    naming every line of the target that raised it; each line is a location."""
    groups: dict[tuple[str, str], list[WarningSite]] = {}
    for site in sites:
        if site.deprecated_torch_api and site.path is not None:
            groups.setdefault((site.category, site.message), []).append(site)
    return [_deprecation_finding(ctx, group) for group in groups.values()]


def _deprecation_finding(ctx: StageContext, group: list[WarningSite]) -> Finding:
    first = group[0]
    places = [Location(path=str(s.path), line=s.line, function=s.function) for s in group]
    sources = sorted(set().union(*(s.sources for s in group)))
    more = f" and {len(group) - 1} more line(s)" if len(group) > 1 else ""
    lines = ", ".join(f"{s.path}:{s.line} ({s.count}x)" for s in group[:20]) + (f" and {len(group) - 20} more" if len(group) > 20 else "")
    return ctx.finding(
        category=DEPRECATED_API,
        severity=Severity.LOW,
        title=f"Deprecated PyTorch API at {first.path}:{first.line}{more}" + (f": `{first.code[:80]}`" if first.code else ""),
        location=places[0],
        problem=f"PyTorch warned while {' and '.join(_ran_by(sources))} ran {'these lines' if more else 'this line'}: {first.category}: {first.message}"
        + (f" (raised from {lines})" if more else ""),
        fix=_fix_for(first.message),
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{first.category} raised {sum(s.count for s in group)} time(s) from {len(group)} line(s)",
            data={
                "message": first.message[:1000], "code": first.code, "sources": sources, "issued_at": first.issued_at,
                "sites": [{"path": s.path, "line": s.line, "code": s.code, "count": s.count} for s in group],
                LOCATIONS_KEY: locations_data(places),
            },
        ),
        # The first line's code, as when each line was a finding of its own: the id stays when lines are added.
        key=f"{first.category}\x1f{first.code}",
    )


def _ran_by(sources: list[str]) -> list[str]:
    return [{"tests": "the test suite", "smoke": "the entrypoint smoke call"}[s] for s in sources]


def _fix_for(message: str) -> str | None:
    """The replacement the warning names; None leaves the category's generic fix."""
    if "Please use" in message:
        return "Switch to the replacement the warning names: " + message[message.index("Please use"):].strip()
    return None

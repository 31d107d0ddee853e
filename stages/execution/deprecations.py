"""Warnings the tests and the smoke call raised, and the deprecated PyTorch APIs among them.

`deprecated-api`: a deprecation warning that comes from torch (`torch.cuda.amp.autocast(...)`,
`torch.cuda.amp.GradScaler(...)`, ...), located at the target's calling line. Observed
(the warning was raised while the code ran), low severity and never blocking: the code
works today and stops working in a later PyTorch.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traingate.pipeline.schema import Category, Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext

_DEPRECATION = ("DeprecationWarning", "PendingDeprecationWarning")


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
        return deprecation and (self.via_torch or "torch" in self.message or "/torch/" in self.issued_at)

    def as_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "message": self.message[:500],
            "location": f"{self.path}:{self.line}" if self.path else self.issued_at,
            "code": self.code,
            "sources": sorted(self.sources),
            "count": self.count,
            "deprecated_torch_api": self.deprecated_torch_api,
        }


def gather(root: Path, test_warnings: list[dict[str, Any]], smoke_warnings: list[dict[str, Any]]) -> list[WarningSite]:
    """Merge the plugin's and the harness's warning records into one site per place+message."""
    sites: dict[tuple[Any, ...], WarningSite] = {}
    for source, records in (("tests", test_warnings), ("smoke", smoke_warnings)):
        for record in records:
            frame = record.get("target_frame") or {}
            path, line = frame.get("path"), frame.get("line")
            key = (record.get("category"), record.get("message"), path, line if path else record.get("filename"))
            site = sites.get(key)
            if site is None:
                code = frame.get("code") or (linecache.getline(str(root / path), int(line)).strip() if path and line else "")
                site = sites[key] = WarningSite(
                    category=str(record.get("category", "Warning")),
                    message=str(record.get("message", "")),
                    path=path,
                    line=line,
                    function=frame.get("function"),
                    code=code,
                    via_torch=bool(record.get("via_torch")),
                    issued_at=f"{record.get('filename')}:{record.get('lineno')}",
                )
            site.sources.add(source)
            site.count += int(record.get("count", 1))  # the harness counts repeats of a record
    return list(sites.values())


def deprecated_api_findings(ctx: StageContext, sites: list[WarningSite]) -> list[Finding]:
    findings = []
    for site in sites:
        if not site.deprecated_torch_api or site.path is None:
            continue
        findings.append(
            ctx.finding(
                category=Category.DEPRECATED_API,
                severity=Severity.LOW,
                title=f"Deprecated PyTorch API at {site.path}:{site.line}" + (f": `{site.code[:80]}`" if site.code else ""),
                location=Location(path=site.path, line=site.line, function=site.function),
                problem=f"PyTorch warned while {' and '.join(_ran_by(site))} ran this line: {site.category}: {site.message}",
                fix=_fix_for(site.message),
                evidence=Evidence(
                    kind=EvidenceKind.OBSERVED,
                    summary=f"{site.category} raised {site.count} time(s) from {site.path}:{site.line}",
                    data={"message": site.message[:1000], "code": site.code, "sources": sorted(site.sources), "issued_at": site.issued_at},
                ),
                key=f"{site.category}\x1f{site.code}",
            )
        )
    return findings


def _ran_by(site: WarningSite) -> list[str]:
    return [{"tests": "the test suite", "smoke": "the entrypoint smoke call"}[s] for s in sorted(site.sources)]


def _fix_for(message: str) -> str | None:
    """The replacement the warning names; None leaves the category's generic fix."""
    if "Please use" in message:
        return "Switch to the replacement the warning names: " + message[message.index("Please use"):].strip()
    return None

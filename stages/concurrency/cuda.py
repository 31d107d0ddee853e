"""`nonblocking-race` and `stream-race`.

On CUDA both are observed in the instrumented run (`traingate.stages.concurrency.probe.cuda`): a pending
non_blocking device-to-host copy read before any synchronisation, and each unsynchronised
access the CUDA sanitizer reports. On a CPU a copy cannot race and there are no streams: the
non_blocking check falls back to reading the source (static, at most medium, never blocking)
and the stream check does not run; the details say so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, location_of
from traingate.stages.concurrency.loaders import as_sent
from traingate.stages.concurrency.static import SourceHit
from traingate.stages.contract.payloads.base import Site
from traingate.stages.concurrency.probe.payloads import NonBlockingPayload, StreamPayload, StreamReport
from traingate.stages.concurrency.rules import NONBLOCKING_RACE, STREAM_RACE

NONBLOCKING = NONBLOCKING_RACE
STREAMS = STREAM_RACE
_CSAN_FRAME = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$', re.M)


def nonblocking_observed(ctx: StageContext, watch: NonBlockingPayload, fallback: Location | None) -> list[Finding]:
    findings = []
    seen: set[tuple[str | None, int | None]] = set()
    for race in watch.races:
        copy, read = race.copy_site, race.read_site
        marker = (copy.path, copy.line) if copy else (None, None)
        if marker in seen:
            continue
        seen.add(marker)
        findings.append(
            ctx.finding(
                category=NONBLOCKING,
                severity=Severity.HIGH,
                title="Result of a non_blocking device-to-host copy read before synchronisation",
                location=location_of(copy) or fallback,
                problem=(
                    f"A copy to the host made with non_blocking=True was read by {race.read_by} at "
                    f"{read.path}:{read.line} (`{read.code}`) before any synchronisation, so the read can see "
                    "the buffer before the copy finished."
                ),
                evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"read by {race.read_by} at {read.path}:{read.line} with the copy pending", data={"copy_site": as_sent(copy), "read_site": as_sent(read)}),
                key=f"observed:{copy.code if copy else ''}",
            )
        )
    return findings


def nonblocking_static(ctx: StageContext, hits: list[SourceHit]) -> list[Finding]:
    return [
        ctx.finding(
            category=NONBLOCKING,
            severity=Severity.MEDIUM,
            title="non_blocking device-to-host copy read before synchronisation (read from source)",
            location=hit.location(),
            problem=(
                f"`{hit.code}` copies to the host with non_blocking=True and the result is {hit.detail} with no synchronize() "
                "in between. On CUDA that read can see the buffer before the copy completes. This run was on a CPU, where "
                "the copy is synchronous and cannot race, so it was found in the source, not observed."
            ),
            impact="On a GPU: stale or partial values read at random (losses, metrics, saved tensors).",
            evidence=Evidence(kind=EvidenceKind.STATIC, summary=f"{hit.path}:{hit.line}: {hit.detail}", data=hit.as_dict()),
            key=f"static:{hit.code}",
        )
        for hit in hits
    ]


@dataclass(frozen=True)
class _Race:
    """One report of the sanitizer: from its payload, or as CSAN printed it to stderr."""

    site: Site | None
    previous_site: Site | None
    operator: str
    streams: tuple[int | str | None, int | str | None]
    message: str
    data: dict[str, Any]  # the evidence: the report but its message

    @classmethod
    def reported(cls, report: StreamReport) -> _Race:
        data = report.model_dump(mode="json", exclude={"message"})
        return cls(report.site, report.previous_site, report.operator, report.streams, report.message, data)


def stream_findings(ctx: StageContext, sanitizer: StreamPayload, stderr: str, fallback: Location | None) -> list[Finding]:
    reports = [_Race.reported(report) for report in sanitizer.reports]
    if not reports and "CSAN detected a possible data race" in stderr:
        reports = [_from_stderr(ctx, block) for block in stderr.split("============================")[1:] if "CSAN detected" in block]
    findings, seen = [], set()
    for report in reports:
        site = report.site
        marker = (site.path, site.line) if site else (None, None)
        if marker in seen:
            continue
        seen.add(marker)
        previous = report.previous_site
        findings.append(
            ctx.finding(
                category=STREAMS,
                severity=Severity.HIGH,
                title="Unsynchronised tensor access from two CUDA streams",
                location=location_of(site) or fallback,
                problem=(
                    f"The CUDA sanitizer saw `{report.operator[:120]}` access a tensor on stream {report.streams[0]} "
                    f"while a kernel on stream {report.streams[-1]} could still be using it"
                    + (f" (previous access at {previous.path}:{previous.line})" if previous else "")
                    + ", with no event or stream synchronisation between them."
                ),
                evidence=Evidence(kind=EvidenceKind.OBSERVED, summary="CSAN detected a possible data race", traceback=report.message, data=report.data),
                key=f"stream:{site.code if site else ''}",
            )
        )
    return findings


def _from_stderr(ctx: StageContext, block: str) -> _Race:
    """A CSAN report printed to stderr, located at its first stack's innermost target frame."""
    from traingate.stages.common.frames import is_target_file, relative

    first_stack = block.split("Previous access")[0]
    site = None
    for match in reversed(list(_CSAN_FRAME.finditer(first_stack))):
        if is_target_file(match.group(1), ctx.root):
            site = Site(path=relative(match.group(1), ctx.root), line=int(match.group(2)), function=match.group(3).strip(), code="")
            break
    return _Race(site, None, "", ("?", "?"), block[-6000:], {"site": as_sent(site), "streams": ["?", "?"], "operator": ""})

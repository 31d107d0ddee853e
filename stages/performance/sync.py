"""`host-sync`: the training step synchronises host and device, per call site.

Counted in the instrumented run (see stages/performance/probe/syncs.py for what is counted and
how). A call site gets a finding when the target's own code makes the sync directly and does
so in at least half of the profiled steps; severity grows with the rate: an explicit
synchronize every step is high (the host waits for the whole queue each step), several
implicit reads per step are medium, about one (a logged `.item()`) is low. Syncs made inside
a torch API the loop must call (GradScaler.step's inf check) count in the metrics, not as
the target's defect; syncs outside the steps (after training, per epoch) are listed, not
reported.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Literal

from traingate.stages.performance.details import SyncRow, SyncSummary
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Severity
from traingate.stages.base import StageContext, location_of
from traingate.stages.performance.probe.payloads import SiteKey, SyncRecords, SyncSiteRecord
from traingate.stages.performance.sign_test import sign_test
from traingate.stages.performance.rules import HOST_SYNC

CATEGORY = HOST_SYNC
PER_STEP_FRACTION = 0.5  # a site counts as "in the step" when it syncs in this share of steps
SEVERAL = 2.0


@dataclass
class SiteSyncs:
    site: tuple[str, int, str]
    code: str
    kinds: set[str] = field(default_factory=set)
    explicit: bool = False
    per_step: Counter[int] = field(default_factory=Counter)  # syncs by step; a step without one reads 0
    outside: int = 0

    def in_steps(self, steps: int) -> int:
        return sum(n for s, n in self.per_step.items() if s < steps)

    def rate(self, steps: int) -> tuple[float, int, int]:
        """(syncs per step, steps with a sync, steps counted) over the whole intervals
        between two step boundaries: the interval before the first boundary lacks the tail
        of an iteration (what follows `optimizer.step()`), so it is left out of the rate."""
        whole = range(1, steps) if steps > 1 else range(0, steps)
        counted = sum(self.per_step[s] for s in whole)
        covered = sum(1 for s in whole if self.per_step[s] > 0)
        return (counted / len(whole) if len(whole) else 0.0), covered, len(whole)


def by_site(records: list[SyncSiteRecord], steps: int, direct: bool, code_of: Callable[[SiteKey], str]) -> list[SiteSyncs]:
    sites: dict[tuple[str, int, str], SiteSyncs] = {}
    for r in records:
        if r.direct is not direct or not r.site:
            continue
        key = (str(r.site[0]), int(r.site[1]), str(r.site[2]))
        item = sites.get(key)
        if item is None:
            item = sites[key] = SiteSyncs(key, code_of(key))
        item.kinds.add(r.kind if direct else f"{r.kind} in {r.via}")
        item.explicit |= r.explicit
        for step, n in r.per_step.items():
            step_i = int(step)
            if step_i < steps:
                item.per_step[step_i] += n
            else:
                item.outside += n
        item.outside += r.before_training
    return sorted(sites.values(), key=lambda s: (-s.in_steps(steps), s.site))


def severity_for(rate: float, explicit: bool) -> Severity:
    if explicit:
        return Severity.HIGH if rate >= 1.0 else Severity.MEDIUM
    return Severity.MEDIUM if rate >= SEVERAL else Severity.LOW


def analyse(ctx: StageContext, syncs: SyncRecords, steps: int, device: str, code_of: Callable[[SiteKey], str]) -> tuple[SyncSummary, list[Finding]]:
    records = syncs.records
    target = by_site(records, steps, True, code_of)
    library = by_site(records, steps, False, code_of)
    findings = []
    rows = []
    for s in target:
        rate, covered, whole = s.rate(steps)
        per_step = whole > 0 and covered >= PER_STEP_FRACTION * whole
        rows.append(_row(s, steps, rate, covered, "target", per_step))
        if per_step:
            findings.append(_finding(ctx, s, steps, rate, covered, whole, device))
    for s in library:
        rate, covered, _ = s.rate(steps)
        rows.append(_row(s, steps, rate, covered, "library", False))
    # Rates are floats: 0.0, not 0, where no site synced.
    target_rate = sum((s.rate(steps)[0] for s in target), 0.0)
    library_rate = sum((s.rate(steps)[0] for s in library), 0.0)
    summary = SyncSummary(
        rows=rows,
        target_per_step=target_rate,
        library_per_step=library_rate,
        in_data_loading=syncs.in_data_loading,
        cuda_sync_debug=syncs.sync_debug_mode,
        counted_as=(
            "Counted on cpu: every call that would synchronise host and device if the loop ran on CUDA"
            if device == "cpu"
            else "Counted on cuda: calls that synchronised host and device"
        ),
    )
    return summary, findings


def _row(s: SiteSyncs, steps: int, rate: float, covered: int, owner: Literal["target", "library"], finding: bool) -> SyncRow:
    return SyncRow(
        path=s.site[0],
        line=s.site[1],
        function=s.site[2],
        code=s.code,
        kinds=sorted(s.kinds),
        explicit=s.explicit,
        in_steps=s.in_steps(steps),
        per_step=round(rate, 3),
        steps_with_sync=covered,
        outside_steps=s.outside,
        made_by=owner,
        finding=finding,
    )


def _finding(ctx: StageContext, s: SiteSyncs, steps: int, rate: float, covered: int, whole: int, device: str) -> Finding:
    kinds = ", ".join(sorted(s.kinds))
    severity = severity_for(rate, s.explicit)
    on_cpu = device == "cpu"
    counted = " (counted on the CPU as what would synchronise on CUDA)" if on_cpu else ""
    # An implicit sync gets the category's generic fix: keep values on the device.
    fix = "Remove the explicit synchronize from the step; to time GPU work, record torch.cuda.Event pairs and read them once at the end." if s.explicit else None
    return ctx.finding(
        category=CATEGORY,
        severity=severity,
        title=f"Host-device sync in the training step: {kinds} at {s.site[0]}:{s.site[1]}",
        location=location_of(s.site),
        problem=(
            f"`{s.code}` synchronises host and device ({kinds}) {rate:.2f} times per step: "
            f"{s.in_steps(steps)} times in {steps} steps, in {covered} of the {whole} whole steps{counted}."
        ),
        fix=fix,
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"{s.in_steps(steps)} syncs in {steps} steps ({rate:.2f}/step) on {device}",
            data={
                "kinds": sorted(s.kinds),
                "explicit": s.explicit,
                "syncs_in_steps": s.in_steps(steps),
                "steps_observed": steps,
                "steps_with_sync": covered,
                "whole_steps": whole,
                "per_step": round(rate, 4),
                "outside_steps": s.outside,
                "device": device,
                "code": s.code,
                # How decisive the per-step count is on few steps: steps with a sync
                # against steps without one.
                "sign_test": sign_test([float(s.per_step[i] > 0) - 0.5 for i in (range(1, steps) if steps > 1 else range(steps))], 0.0).record("with a sync").data(),
            },
        ),
        key=f"host-sync {kinds} {s.code}",
    )

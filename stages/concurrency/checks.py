"""The concurrency checks that read the instrumented run: one object per check, each naming
the instruments whose payloads it decides from (`stages/agent/checks.py`). The stage lists them in
`CHECKS` (`stage.py`), in the order they run, beside `OWN_RUN_CHECKS`: the determinism check,
which makes runs of its own. Each reads a payload the stage checked the run handed back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from traingate.pipeline.model.schema import Location
from traingate.stages.base import EntrypointRun, StageContext
from traingate.stages.agent.checks import Checked
from traingate.stages.concurrency.config import ConcurrencyConfig
from traingate.stages.concurrency.cuda import nonblocking_observed, nonblocking_static, stream_findings
from traingate.stages.concurrency.details import CheckNote, NonBlockingDetails, SourceMatch
from traingate.stages.concurrency.loaders import loader_details, loader_findings
from traingate.stages.concurrency.protocol import protocol_details, protocol_findings
from traingate.stages.concurrency.static import SourceHit, nonblocking_reads
from traingate.stages.concurrency.probe.payloads import (
    CONCURRENCY_LOADERS as LOADERS,
    CONCURRENCY_NONBLOCKING as NONBLOCKING,
    CONCURRENCY_STREAMS as STREAMS,
    CONCURRENCY_TRACE as TRACE,
    LoaderPayload,
    NonBlockingPayload,
    ProtocolTracePayload,
    StreamPayload,
)
from traingate.stages.contract.payloads.base import Payload

P = TypeVar("P", bound=Payload)


@dataclass
class InstrumentedRun:
    """What the checks of the instrumented run read: its payloads, the device it ran on and the
    line a finding without one of its own is located at."""

    ctx: StageContext
    run: EntrypointRun
    fallback: Location | None

    @property
    def cuda(self) -> bool:
        return self.ctx.device == "cuda"

    def observed(self, spec: str, model: type[P]) -> P:
        """A payload of the instrumented run, which the stage checked is there."""
        payload = self.run.payload(spec, model)
        assert payload is not None, spec
        return payload


class GradScalerProtocol:
    """gradscaler-protocol: GradScaler and optimizer calls out of their order (a step before
    unscale_, an update skipped), iteration by iteration."""

    name = "gradscaler"
    reads = (TRACE,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        trace = facts.observed(TRACE, ProtocolTracePayload)
        findings, result = protocol_findings(facts.ctx, trace, facts.fallback)
        return Checked(findings, protocol_details(trace, result))


class DataLoaderHazards:
    """dataloader-hazard: a DataLoader whose workers fail under another start method, or whose
    persistent workers are started anew every epoch."""

    name = "dataloader"
    reads = (LOADERS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        watch = facts.observed(LOADERS, LoaderPayload)
        findings = loader_findings(facts.ctx, watch, facts.fallback)
        return Checked(findings, loader_details(watch, list(facts.ctx.section(ConcurrencyConfig).dataloader_start_methods)))


class NonBlockingCopies:
    """nonblocking-race: a non_blocking device-to-host copy read before a synchronisation; observed
    at the dispatcher on CUDA, read from the source (never blocking) on a CPU, where it cannot race."""

    name = "nonblocking"
    reads = (NONBLOCKING,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        ctx = facts.ctx
        hits = nonblocking_reads(ctx.root)
        if facts.cuda:
            watch = facts.observed(NONBLOCKING, NonBlockingPayload)
            return Checked(
                nonblocking_observed(ctx, watch, facts.fallback),
                NonBlockingDetails(
                    ran=True,
                    mode="observed",
                    note=f"observed at the dispatcher on {ctx.device}: {watch.copies} non_blocking device-to-host copies, {len(watch.races)} read before a synchronisation",
                    static_matches=_matches(hits),
                ),
            )
        return Checked(
            nonblocking_static(ctx, hits),
            NonBlockingDetails(
                ran=True,
                mode="static",
                note="on a CPU a device-to-host copy is synchronous and cannot race, so it was not observed; the source was read for host copies made with non_blocking=True and read before a synchronize() (static, never blocking)",
                static_matches=_matches(hits),
            ),
        )


class StreamRaces:
    """stream-race: unsynchronised accesses across CUDA streams, as the CUDA sanitizer reports them (CUDA only)."""

    name = "streams"
    reads = (STREAMS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        if not facts.cuda:
            return Checked(record=CheckNote(ran=False, note=f"not run: the CUDA sanitizer watches CUDA streams, and this run was on {facts.ctx.device}"))
        sanitizer = facts.observed(STREAMS, StreamPayload)
        return Checked(
            stream_findings(facts.ctx, sanitizer, facts.run.child.stderr, facts.fallback),
            CheckNote(ran=sanitizer.available, note=f"CUDA sanitizer (CSAN) over the instrumented run: {sanitizer.total} unsynchronised access(es) reported"),
        )


def _matches(hits: list[SourceHit]) -> list[SourceMatch]:
    return [SourceMatch(path=h.path, line=h.line, function=h.function, code=h.code, detail=h.detail) for h in hits]


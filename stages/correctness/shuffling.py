"""unshuffled-training: a DataLoader that drives optimizer steps never shuffles, or its
DistributedSampler repeats one order every epoch. Observed; medium, so not blocking by default."""

from __future__ import annotations

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext
from traingate.stages.correctness.probe.payloads import LoaderOrdering, LoadersPayload
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import UNSHUFFLED_TRAINING

CATEGORY = UNSHUFFLED_TRAINING


def shuffling_findings(ctx: StageContext, watch: LoadersPayload, fallback: Location) -> list[Finding]:
    findings = []
    for loader in watch.loaders:
        if not loader.steps or loader.iterable_dataset:
            continue  # not a training loader, or the dataset orders itself
        problem = _problem(loader)
        if problem is None:
            continue
        kind, text = problem
        where = located.site(watch, loader.site)
        findings.append(
            ctx.finding(
                category=CATEGORY,
                severity=Severity.MEDIUM,
                title=(
                    f"The training DataLoader uses a {loader.sampler}: every epoch sees the data in the same order"
                    if kind == "sequential"
                    else f"DistributedSampler.set_epoch is never called over {loader.epochs} epochs: every epoch repeats one order"
                ),
                location=located.location(watch, loader.site, fallback),
                problem=text + (f" The loader is built at `{where.code}`." if where else ""),
                evidence=Evidence(
                    kind=EvidenceKind.OBSERVED,
                    summary=f"{loader.steps} optimizer step(s) fed by this loader over {loader.epochs} epoch(s), sampler {loader.sampler}",
                    data={"loader": {**located.record(loader), "site": located.record(where) if where else None}, "kind": kind},
                ),
                key=f"{kind}:{where.path}:{where.line}" if where else kind,
            )
        )
    return findings


def _problem(loader: LoaderOrdering) -> tuple[str, str] | None:
    sampler = loader.sampler
    if sampler == "SequentialSampler" and (loader.length or 0) > 1:
        return "sequential", (
            f"This DataLoader handed out the batches of {loader.steps} optimizer step(s) with a SequentialSampler "
            f"({loader.length} batches an epoch, {loader.epochs} epoch(s)): no shuffle=True and no shuffling sampler, "
            "so the batches always come in dataset order."
        )
    if sampler == "DistributedSampler" and loader.sampler_shuffles and loader.epochs > 1 and not loader.set_epoch_calls:
        return "set-epoch", (
            f"This DataLoader's DistributedSampler shuffles, but set_epoch() was never called while the loader was iterated over "
            f"{loader.epochs} epochs: the sampler seeds its shuffle with the epoch, so every epoch got the same order."
        )
    return None

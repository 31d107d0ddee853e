"""data-leakage: an evaluation DataLoader handed out samples a training DataLoader also did
(`probe.loaders`, by a fingerprint of each sample)."""

from __future__ import annotations

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import LoaderOverlap, LoadersPayload
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import DATA_LEAKAGE

CATEGORY = DATA_LEAKAGE


def leakage_findings(ctx: StageContext, loaders: LoadersPayload, fallback: Location) -> list[Finding]:
    return [_finding(ctx, loaders, overlap, fallback) for overlap in loaders.overlaps if _known(loaders, overlap)]


def _known(loaders: LoadersPayload, overlap: LoaderOverlap) -> bool:
    return 0 <= overlap.trained < len(loaders.loaders) and 0 <= overlap.evaluated < len(loaders.loaders)


def _line(loaders: LoadersPayload, index: int | None) -> str:
    found = located.site(loaders, index)
    return f"{found.path}:{found.line} (`{found.code}`)" if found else "a line outside the target"


def _short(loaders: LoadersPayload, index: int | None) -> str:
    found = located.site(loaders, index)
    return f"{found.path}:{found.line}" if found else "?"


def _finding(ctx: StageContext, loaders: LoadersPayload, overlap: LoaderOverlap, fallback: Location) -> Finding:
    trained, evaluated = loaders.loaders[overlap.trained], loaders.loaders[overlap.evaluated]
    share = overlap.overlap / overlap.evaluated_samples
    return ctx.finding(
        category=CATEGORY,
        title=f"{overlap.overlap} of the {overlap.evaluated_samples} samples evaluated ({share:.0%}) were also trained on",
        location=located.location(loaders, evaluated.site, fallback),
        problem=(
            f"The DataLoader built at {_line(loaders, evaluated.site)} drove no optimizer step (an evaluation loader) and handed out {overlap.evaluated_samples} distinct samples; "
            f"{overlap.overlap} of them ({share:.0%}) were also handed out by the training DataLoader built at {_line(loaders, trained.site)} "
            f"({overlap.trained_samples} distinct samples, {trained.steps} optimizer step(s)). The two loaders read different dataset objects, so this is not a train-accuracy pass: "
            "the evaluation and training sets overlap (two random splits drawn from different permutations, or a split made twice)."
        ),
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{overlap.overlap} of {overlap.evaluated_samples} evaluated samples also fed training steps",
            data={
                "overlap": overlap.overlap,
                "evaluated_samples": overlap.evaluated_samples,
                "trained_samples": overlap.trained_samples,
                "share": round(share, 4),
                "evaluation_loader": site_record(located.site(loaders, evaluated.site)),
                "training_loader": site_record(located.site(loaders, trained.site)),
            },
        ),
        key=f"leakage:{_short(loaders, trained.site)}:{_short(loaders, evaluated.site)}",
    )

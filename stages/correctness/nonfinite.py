"""no-learning: the loss became NaN or inf during training (first step and backward line).

A non-finite loss the training recovers from is not reported: a GradScaler or an overflow
guard that skips the step leaves the parameters finite and the later losses finite. It is
reported when the run ends with a non-finite loss or with non-finite parameters.
"""

from __future__ import annotations

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import LossesPayload, StepsPayload
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import NO_LEARNING

CATEGORY = NO_LEARNING


def nonfinite_findings(ctx: StageContext, losses: LossesPayload, steps: StepsPayload | None, fallback: Location) -> list[Finding]:
    first = losses.first_non_finite
    corrupted = steps.non_finite_params if steps is not None else []
    if not first or not (losses.last_non_finite or corrupted):
        return []
    count, calls = losses.non_finite, losses.calls
    before = [v for v in losses.losses[: first.call] if isinstance(v, float)][-5:]
    where = located.code(losses, first.site)
    return [
        ctx.finding(
            category=CATEGORY,
            severity=Severity.CRITICAL,
            title=f"The loss became {first.value} at optimizer step {first.step} ({count} of {calls} backward call(s) non-finite)",
            location=located.location(losses, first.site, fallback),
            problem=(
                f"backward was called on a loss of {first.value} at `{where or 'backward()'}` in optimizer step {first.step} "
                f"(backward call {first.call}); {count} of the run's {calls} backward calls had a non-finite loss. "
                + (f"The losses just before were {', '.join(f'{v:.6g}' for v in before)}. " if before else "It was the first loss of the run. ")
                + (f"The run ended with NaN or inf in {len(corrupted)} parameter(s) ({', '.join(f'`{n}`' for n in corrupted[:5])})." if corrupted else "The run ended with a non-finite loss: it never recovered.")
            ),
            evidence=Evidence(
                kind=EvidenceKind.OBSERVED,
                summary=f"first non-finite loss {first.value} at step {first.step}, backward call {first.call}",
                data={
                    "first": {**located.record(first), "site": site_record(located.site(losses, first.site))},
                    "non_finite": count,
                    "calls": calls,
                    "losses_before": before,
                    "last_loss_non_finite": losses.last_non_finite,
                    "non_finite_parameters": corrupted,
                },
            ),
            key="nonfinite",
        )
    ]

"""no-learning: the loss became NaN or inf during training (first step and backward line).

A non-finite loss the training recovers from is not reported: a GradScaler or an overflow
guard that skips the step leaves the parameters finite and the later losses finite. It is
reported when the run ends with a non-finite loss or with non-finite parameters.
"""

from __future__ import annotations

from typing import Any

from traingate.pipeline.schema import Category, Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext
from traingate.stages.correctness import located

CATEGORY = Category.NO_LEARNING


def nonfinite_findings(ctx: StageContext, losses: dict[str, Any], steps: dict[str, Any], fallback: Location) -> list[Finding]:
    first = losses.get("first_non_finite")
    corrupted = steps.get("non_finite_params", [])
    if not first or not (losses.get("last_non_finite") or corrupted):
        return []
    count, calls = losses.get("non_finite", 1), losses.get("calls", 0)
    before = [v for v in losses.get("losses", [])[: first["call"]] if isinstance(v, float)][-5:]
    where = located.code(losses, first["site"])
    return [
        ctx.finding(
            category=CATEGORY,
            severity=Severity.CRITICAL,
            title=f"The loss became {first['value']} at optimizer step {first['step']} ({count} of {calls} backward call(s) non-finite)",
            location=located.location(losses, first["site"], fallback),
            problem=(
                f"backward was called on a loss of {first['value']} at `{where or 'backward()'}` in optimizer step {first['step']} "
                f"(backward call {first['call']}); {count} of the run's {calls} backward calls had a non-finite loss. "
                + (f"The losses just before were {', '.join(f'{v:.6g}' for v in before)}. " if before else "It was the first loss of the run. ")
                + (f"The run ended with NaN or inf in {len(corrupted)} parameter(s) ({', '.join(f'`{n}`' for n in corrupted[:5])})." if corrupted else "The run ended with a non-finite loss: it never recovered.")
            ),
            evidence=Evidence(
                kind=EvidenceKind.OBSERVED,
                summary=f"first non-finite loss {first['value']} at step {first['step']}, backward call {first['call']}",
                data={
                    "first": {**first, "site": located.site(losses, first["site"])},
                    "non_finite": count,
                    "calls": calls,
                    "losses_before": before,
                    "last_loss_non_finite": bool(losses.get("last_non_finite")),
                    "non_finite_parameters": corrupted,
                },
            ),
            key="nonfinite",
        )
    ]

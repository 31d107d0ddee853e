"""Typed payloads of the instruments: what each instrument's `collect()` hands back, defined
once for the probe that writes it and the analysis that reads it.

Each probe's `collect()` builds its model from its data and returns the model's JSON form
(`Payload.sent`), so data that does not fit fails in the probe, where the harness records it
as a failed collect(). The harness result's `instruments` field maps an instrument spec
(`traingate.stages.contract.instruments`) to its payload; `check_instruments` validates each
against its model when the result is built and when it is read, so a payload of the wrong
shape that reaches the parent is a malformed result (the stage fails closed) instead of a
`KeyError` or a silent default deep inside an analysis. The analyses read each payload as its model (`EntrypointRun.payload` on the parent
side), so a field is read by name and type, never through a dict default.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails

from traingate.stages.contract import instruments
from traingate.stages.contract.payloads import concurrency, correctness, performance

MODELS: dict[str, type[BaseModel]] = {**performance.MODELS, **concurrency.MODELS, **correctness.MODELS}


def check_instruments(payloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Validate every payload against its instrument's model; raise ValueError for a built-in
    instrument without one, pydantic's ValidationError located at the spec and the field
    for a payload that does not fit."""
    for spec, payload in payloads.items():
        model = MODELS.get(spec)
        if model is None:
            if spec in instruments.ALL:
                raise ValueError(f"the built-in instrument {spec!r} has no payload model")
            continue  # a stage of another package: its own instruments, its own checks
        if instruments.collect_error(payload) is not None:
            continue  # its collect() raised; the stage reports the traceback
        try:
            model.model_validate(payload)
        except ValidationError as exc:
            # The same errors, each located under the instrument's spec.
            raise ValidationError.from_exception_data(
                exc.title, [_under(spec, error) for error in exc.errors()]
            ) from None
    return payloads


def _under(spec: str, error: ErrorDetails) -> InitErrorDetails:
    details: InitErrorDetails = {"type": error["type"], "loc": (spec, *error["loc"]), "input": error["input"]}
    if "ctx" in error:
        details["ctx"] = error["ctx"]
    return details

"""Typed payloads of the instruments: what each instrument's `collect()` hands back, defined
once for the probe that writes it and the analysis that reads it.

Each stage keeps its instruments' models in `stages/<name>/probe/payloads.py` (`MODELS`: spec ->
model); this package holds what they share (`base`: `Payload`, `Site`). Each probe's
`collect()` builds its model from its data and returns the model's JSON form (`Payload.sent`),
so data that does not fit fails in the probe, where the harness records it as a failed
collect(). The parent validates every payload of a harness result against the models of the
stage that asked for it when it reads the result (`check_instruments`, given as pydantic's
validation context, `messages.MODELS_CONTEXT`), so a payload of the wrong shape that reaches the parent is a malformed
result (the stage fails closed) instead of a `KeyError` or a silent default deep inside an
analysis. The analyses read each payload as its model (`EntrypointRun.payload`), so a field
is read by name and type, never through a dict default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails

from .. import instruments


def check_instruments(payloads: dict[str, dict[str, Any]], models: Mapping[str, type[BaseModel]]) -> dict[str, dict[str, Any]]:
    """Validate every payload that has a model against it; raise pydantic's ValidationError
    located at the spec and the field for a payload that does not fit. A payload of an
    instrument without a model (another package's) is its stage's to check."""
    for spec, payload in payloads.items():
        model = models.get(spec)
        if model is None or instruments.collect_error(payload) is not None:
            continue  # no model here, or its collect() raised: the stage reports the traceback
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

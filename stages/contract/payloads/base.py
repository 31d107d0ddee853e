"""The base of every instrument payload model."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Payload(BaseModel):
    """What one instrument's `collect()` hands back, or a record inside it. Unknown keys are
    an error, so a probe and the analysis reading it cannot drift apart unnoticed."""

    # Built at first use, not at import: the gate and an agent import more payload models
    # than their runs hand back.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    @classmethod
    def sent(cls, data: dict[str, Any]) -> dict[str, Any]:
        """`data` built into this model (the nested records with it), handed back as the
        probe's `collect()` returns it: pydantic's ValidationError where it does not fit.

        The dump reproduces `data` on the wire: only the keys the probe gave
        (`exclude_unset`; a default it left out stays out, as the parent and the reports copy
        records as written), by their wire names (`by_alias`: `class`), tuples as lists, in
        the model's field order, which is the order the probes write them in. NaN and
        infinity in a float field stay floats (pydantic's JSON mode keeps them in a dump to
        Python objects), so the harness's `json.dumps` writes them as it did."""
        return cls.model_validate(data).model_dump(mode="json", by_alias=True, exclude_unset=True)


class Site(Payload):
    """A line of the target's code with its source text, as the probes record it
    (`stages/common/frames.py: site_fields`): the one site model of every stage's payloads."""

    path: str  # relative to the target root
    line: int
    function: str
    code: str


"""Parent side: the one shape of a check, the same in every stage.

A check names what it reads (the instruments whose payloads, or the runs whose results, it
decides from) and turns the facts its stage gathered into findings, with, where the stage's
page shows one, a record of what it saw. A stage lists its checks in one tuple, `CHECKS` in
its `stage.py`, and runs them in that order over one facts object of its own: a later check
may read what an earlier one found through those facts (the correctness stage's baseline
comparison reads which categories the others explained), never through shared fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from traingate.pipeline.model.schema import Finding

FactsT = TypeVar("FactsT", contravariant=True)


@dataclass
class Checked:
    """What one check decided: its findings, and the record the stage's page shows of it
    (None: the check shows nothing, or was not reached)."""

    findings: list[Finding] = field(default_factory=list)
    record: Any = None


class Check(Protocol, Generic[FactsT]):
    """One check of a stage: `name` keys its record in the stage's details, `reads` names the
    instruments (or runs) it decides from, `evaluate` decides."""

    @property
    def name(self) -> str: ...

    @property
    def reads(self) -> tuple[str, ...]: ...

    def evaluate(self, facts: FactsT) -> Checked: ...


def run_checks(checks: Iterable[Check[FactsT]], facts: FactsT, findings: list[Finding]) -> dict[str, Any]:
    """Each check in order over `facts`, its findings appended to `findings` as it returns
    (so the next one may read them); the records by check name, None for a check with none."""
    records: dict[str, Any] = {}
    for check in checks:
        checked = check.evaluate(facts)
        findings += checked.findings
        records[check.name] = checked.record
    return records

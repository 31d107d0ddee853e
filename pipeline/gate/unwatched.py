"""`unwatched-divergence`: the training the gate observed is the training that runs unwatched.

Every stage that observes training leaves marks the code under review can read in its own
process (a global optimizer hook, module hooks, a patched `Tensor.backward`). A change written
to be merged can train correctly only while it sees one. The execution stage's smoke call runs
the configured entrypoint with no instrument; the other stages' instrumented runs call the same
entrypoint with the same configuration and seed. Once each returns, the harness reads what it
left, where nothing of the target's runs any more (`stages/harness/left.py`): the models still
alive, each with a digest of its parameters, and the value returned.

Where the concurrency stage found the training deterministic (its same-seed runs identical),
a watched run and the unwatched one of the same AMP setting must leave the same: the first
model whose parameters differ, or else the first returned value that differs (timings left
out, `pipeline/model/returned.py`; returned values only where the same-seed runs returned the
same too), is a blocking finding naming both. Where the training is not deterministic, the
comparison is not measured, and the report says so with an info finding, never as passed;
where no stage compared same-seed runs (the concurrency stage did not run), the report lists
that stage as not run. The instruments change nothing the
comparison reads: on clean training the digests agree to the last bit (docs/stages.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traingate.pipeline.model.findings import finding as make_finding
from traingate.pipeline.model.returned import comparable_leaves, same_value
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Location, RunLeft, Severity, StageReport

IDENTICAL = "identical"  # how a determinism verdict starts when the same-seed runs trained alike
ALL_IDENTICAL = "identical:"  # ... and returned the same values too


@dataclass(frozen=True)
class Difference:
    what: str  # "model" or "returned"
    key: str  # the model (class, parameters) or the returned value's path
    unwatched: Any
    watched: Any

    def describe(self) -> str:
        if self.what == "model":
            return f"the parameters of {self.key} left by the call"
        return f"the returned value `{self.key}`"


def first_difference(unwatched: RunLeft, watched: RunLeft, returned: bool = True) -> Difference | None:
    """The first fact both runs left that differs: a model both left, then (`returned`) a
    returned value."""
    mine = _by_model(unwatched.models)
    theirs = _by_model(watched.models)
    for key in sorted(mine.keys() & theirs.keys()):
        if mine[key] != theirs[key]:
            return Difference("model", f"`{key[0]}` ({key[1]:,} parameters)", mine[key], theirs[key])
    if not returned:
        return None
    kept_a, _ = comparable_leaves(unwatched.returned)
    kept_b, _ = comparable_leaves(watched.returned)
    for path in sorted(kept_a.keys() & kept_b.keys()):
        if not same_value(kept_a[path], kept_b[path]):
            return Difference("returned", path, kept_a[path], kept_b[path])
    return None


def _by_model(models: list[dict[str, Any]]) -> dict[tuple[str, int], list[str]]:
    found: dict[tuple[str, int], list[str]] = {}
    for m in models:
        found.setdefault((str(m.get("model")), int(m.get("parameters") or 0)), []).append(str(m.get("digest")))
    return {key: sorted(digests) for key, digests in found.items()}


def determinism(reports: list[StageReport]) -> str | None:
    """The verdict of the stage that compared same-seed runs (the concurrency stage's), None
    where none did."""
    return next((report.determinism for report in reports if report.determinism is not None), None)


def unwatched_findings(reports: list[StageReport], stage: str, entrypoint: str | None, block_on: set[Severity]) -> list[Finding]:
    """The comparison's finding, if any: blocking where a deterministic training left other
    facts when watched; info where there was a pair to compare but it could not be judged."""
    runs = [run for report in reports for run in report.runs_left]
    unwatched = [run for run in runs if not run.watched]
    pairs = [(u, w) for w in runs if w.watched for u in unwatched if u.amp == w.amp]
    if not pairs:
        return []
    verdict = determinism(reports)
    location = _entrypoint_location(entrypoint)
    if verdict is None:
        return []  # no stage compared same-seed runs (the concurrency stage did not run): listed as not run
    if not verdict.startswith(IDENTICAL):
        return [_not_measured(stage, location, block_on, pairs[0], verdict)]
    # Same-seed runs that trained identically but returned something else (a printed table's
    # timing column): the returned values are not a fact to compare, the models still are.
    returned = verdict.startswith(ALL_IDENTICAL)
    differing = [(u, w, d) for u, w in pairs if (d := first_difference(u, w, returned)) is not None]
    if not differing:
        return []
    u, w, d = differing[0]
    return [make_finding(
        stage=stage, category=Category.UNWATCHED_DIVERGENCE, severity=Severity.HIGH, location=location,
        title=f"The training behaves differently when watched: {d.describe()} differs from the unwatched run",
        problem=(
            f"The same configuration and seed, trained deterministically (the concurrency stage's same-seed runs were {verdict}), left different {d.describe()} "
            f"with the gate's instruments ({w.stage} stage, run `{w.label}`) and without any ({u.stage} stage, run `{u.label}`): "
            f"{_shown(d.watched)} watched, {_shown(d.unwatched)} unwatched. The training the gate observed is not the training that runs when nobody watches, "
            "so nothing the stages measured holds for it."
        ),
        fix="Remove the code that reads the gate's marks (optimizer or module hooks, modes, trace functions, patched torch functions, the environment): train the same way whether or not anything observes the loop.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"{d.describe()}: watched {_shown(d.watched)}, unwatched {_shown(d.unwatched)}", data=_data(u, w, d, verdict)),
        block_on=block_on, key=f"unwatched:{w.stage}:{w.label}",
    )]


def _not_measured(stage: str, location: Location | None, block_on: set[Severity], pair: tuple[RunLeft, RunLeft], verdict: str) -> Finding:
    u, w = pair
    why = f"the training is not deterministic ({verdict})"
    return make_finding(
        stage=stage, category=Category.UNWATCHED_DIVERGENCE, severity=Severity.INFO, location=location,
        title="Unwatched run against the watched ones: not measured",
        problem=f"The unwatched run ({u.stage} {u.label}) could not be compared with the watched ones ({w.stage} {w.label}, ...): {why}, so a difference could not be told from the training's own variation.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"not measured: {why}", data={"unwatched_run": f"{u.stage}:{u.label}", "watched_run": f"{w.stage}:{w.label}", "determinism": verdict}),
        block_on=block_on, key="unwatched-not-measured",
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _data(u: RunLeft, w: RunLeft, d: Difference, verdict: str | None) -> dict[str, Any]:
    return {
        "unwatched_run": f"{u.stage}:{u.label}", "watched_run": f"{w.stage}:{w.label}", "amp": u.amp, "fact": d.what, "key": d.key,
        "unwatched": d.unwatched, "watched": d.watched, "determinism": verdict,
    }


def _entrypoint_location(entrypoint: str | None) -> Location | None:
    """The configured function's module, where the training that differs is called."""
    if not entrypoint or ":" not in entrypoint:
        return None
    module, _, function = entrypoint.partition(":")
    return Location(path=module.replace(".", "/") + ".py", line=None, function=function.split(".")[-1] or None)

"""`nondeterminism`: the same training run twice, with the same seeds, compared exactly.

What is compared is what training computes: the loss at each optimizer step and the
parameters' fingerprints after it (probe/params.py), step by step, naming the first step and
tensor that differ. Returned values are compared only after leaving out anything time-like
(keys, dataclass fields and table columns named like durations, timestamps, throughput); a
difference only there, with identical losses and parameters, is reported as info, never blocking.

A divergence is what was measured; where it comes from is told apart by more runs:
- runs with different PYTHONHASHSEED diverge but a run with the first one's hash seed
  reproduces it exactly: the results depend on hash order (iterating a set of strings);
- runs with the same PYTHONHASHSEED diverge: a random source is not seeded from the
  configured seed (seeded from the OS's entropy or the clock), or an op is nondeterministic;
  the seeding calls recorded in both runs, and a rerun with
  torch.use_deterministic_algorithms(True), point at which.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, TypedDict

from traingate.stages.concurrency.details import CurveRow
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import EntrypointRun, SiteRecord, StageContext, site_record
from traingate.stages.concurrency.probe.payloads import Fingerprint, ParamFingerprints, ParamStep, RngPayload, SeedingRecord
from traingate.pipeline.model.text import clip_line, strip_ansi
from traingate.pipeline.model.returned import comparable_leaves, same_value
from traingate.stages.concurrency.rules import NONDETERMINISM

CATEGORY = NONDETERMINISM
_DETERMINISTIC_OP = re.compile(r"^(.+?) does not have a deterministic implementation", re.M)


class SeedingCause(TypedDict):
    """A seeding call that explains two runs diverging, as the evidence shows it."""

    api: str
    site: SiteRecord
    why: str
    seeds: list[bool | int | float | str | None]


class RefusedOp(TypedDict):
    """The op torch.use_deterministic_algorithms(True) refused, as the evidence shows it."""

    op: str
    message: str
    site: SiteRecord | None  # the exception's frame in the target, when it has one


class NondeterminismData(TypedDict, total=False):
    """What a `nondeterminism` finding's evidence adds, by how its source was told apart."""

    reproduced_by: str  # hash-order: the run with run 1's hash seed that reproduced it
    seeding_calls: list[SeedingCause]
    deterministic_rerun: RefusedOp
    static_hint: list[dict[str, object]]  # `SourceHit.as_dict` of sets the source iterates
    site_code: str


@dataclass
class RunData:
    """What one run observed, as the comparison needs it."""

    label: str
    hash_seed: str
    run: EntrypointRun
    losses: list[list[float | str | None]]
    rng: RngPayload | None = None  # None: the run handed back no seeding calls
    params: ParamFingerprints | None = None  # the probe's parameter fingerprints; None: none handed back

    @property
    def fingerprinted(self) -> list[ParamStep]:
        """The parameters after each fingerprinted optimizer step."""
        return self.params.steps if self.params is not None else []

    @property
    def seeding(self) -> list[SeedingRecord]:
        return self.rng.records if self.rng is not None else []

    @property
    def target_modules(self) -> list[str]:
        return self.rng.target_modules if self.rng is not None else []

    @property
    def trained(self) -> bool:
        """Whether any optimizer step was observed (so training itself was compared)."""
        return bool(self.losses or self.fingerprinted)

    @property
    def outcome(self) -> str:
        if self.run.ok:
            return "returned"
        failure = self.run.failure() or "failed"
        return failure


@dataclass(frozen=True)
class Divergence:
    where: str  # "step", "returned" or "outcome"
    step: int | None
    first: Any
    second: Any
    key: str | None = None

    def describe(self) -> str:
        if self.where == "parameters":
            return f"optimizer step {self.step + 1 if self.step is not None else '?'}: parameter `{self.key}` (float64 sum, L2 norm) {_fmt(self.first)} vs {_fmt(self.second)}"
        if self.where == "step":
            return f"optimizer step {self.step + 1 if self.step is not None else '?'}: loss {_fmt(self.first)} vs {_fmt(self.second)}"
        if self.where == "returned":
            if isinstance(self.first, str) and isinstance(self.second, str) and ("\n" in self.first + self.second or len(self.first + self.second) > 160):
                return f"returned `{self.key}`: {text_difference(self.first, self.second)}"
            return f"returned `{self.key}`: {_fmt(self.first)} vs {_fmt(self.second)}"
        after = f" after {self.step} optimizer step(s) that matched" if self.step else ""
        return f"outcome{after}: {_clipped(self.first)} vs {_clipped(self.second)}"

    def shown_values(self) -> list[Any]:
        """The two values as evidence: for the text of a returned object, the lines that differ."""
        if self.where == "returned" and isinstance(self.first, str) and isinstance(self.second, str):
            a, b = self.first.splitlines() or [""], self.second.splitlines() or [""]
            for x, y in zip(a, b, strict=False):
                if x != y:
                    return [clip_line(strip_ansi(x), 300), clip_line(strip_ansi(y), 300)]
            return [f"{len(a)} lines", f"{len(b)} lines"]
        return [self.first, self.second]


def _clipped(text: Any, limit: int = 200) -> str:
    return clip_line(strip_ansi(str(text)), limit)


def _fmt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, float):
        return repr(value)
    return clip_line(strip_ansi(str(value)), 200)


def text_difference(first: str, second: str) -> str:
    """Where two texts (the summarised repr of a returned object, a table) first differ, as the
    line that differs in each, never a truncated repr of the whole object."""
    a, b = strip_ansi(first).splitlines() or [""], strip_ansi(second).splitlines() or [""]
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"line {index + 1} of its text differs: {clip_line(x.strip(), 120)!r} vs {clip_line(y.strip(), 120)!r}"
    n = min(len(a), len(b))
    return f"{len(a)} vs {len(b)} lines of text; the first {n} agree"


def compare(a: RunData, b: RunData) -> Divergence | None:
    """The first difference between two runs: a step's loss or the parameters after it, then
    a returned value, then the outcome."""
    steps_a, steps_b = a.fingerprinted, b.fingerprinted
    for index in range(max(len(a.losses), len(b.losses), len(steps_a), len(steps_b))):
        if index < len(a.losses) and index < len(b.losses) and not same_value(a.losses[index], b.losses[index]):
            return Divergence("step", index, a.losses[index], b.losses[index])
        if index < len(steps_a) and index < len(steps_b) and a.params is not None and b.params is not None:
            moved = _parameter_difference(a.params, b.params, index)
            if moved is not None:
                return moved
    if len(a.losses) != len(b.losses):
        n = min(len(a.losses), len(b.losses))
        if not (a.run.ok and b.run.ok):
            # A run that failed stopped early: its missing steps say how it ended, not what it computed.
            return Divergence("outcome", n, a.outcome, b.outcome)
        return Divergence("step", n, a.losses[n] if n < len(a.losses) else "no step", b.losses[n] if n < len(b.losses) else "no step")
    if a.run.ok and b.run.ok:
        left, _ = comparable_leaves(a.run.record.returned if a.run.record is not None else None)
        right, _ = comparable_leaves(b.run.record.returned if b.run.record is not None else None)
        for key in sorted(set(left) | set(right)):
            x, y = left.get(key), right.get(key)  # None: the other run has no such leaf
            if not same_value(x, y):
                return Divergence("returned", None, x, y, key)
        return None
    if a.outcome != b.outcome:
        return Divergence("outcome", None, a.outcome, b.outcome)
    return None


def _parameter_difference(a: ParamFingerprints, b: ParamFingerprints, index: int) -> Divergence | None:
    """The first parameter whose fingerprint differs after step `index`, named when the step is
    one of those recorded per parameter, else its group."""
    x, y = a.steps[index], b.steps[index]
    if same_value(x.groups, y.groups) and same_value(x.params, y.params) and x.optimizer == y.optimizer:
        return None
    optimizer = x.optimizer
    names = a.names[optimizer] if optimizer < len(a.names) else []
    for i, (p, q) in enumerate(zip(x.params or [], y.params or [], strict=False)):
        if not same_value(p, q):
            return Divergence("parameters", index, list(p), list(q), names[i] if i < len(names) else f"parameter {i}")
    for g, (p, q) in enumerate(zip(x.groups, y.groups, strict=False)):
        if not same_value(p, q):
            return Divergence("parameters", index, list(p), list(q), f"optimizer {optimizer}, param group {g} (summed)")
    return Divergence("parameters", index, _listed(x.groups), _listed(y.groups), f"optimizer {optimizer}")


def _listed(fingerprints: list[Fingerprint]) -> list[list[float | None]]:
    """Fingerprints as the probe sent them: lists, as the evidence shows them."""
    return [list(fingerprint) for fingerprint in fingerprints]


def side_by_side(a: RunData, b: RunData, divergence: Divergence | None, before: int = 8, limit: int = 40) -> list[CurveRow]:
    """The two loss curves up to (and one step past) the divergence."""
    end = (divergence.step + 1) if divergence and divergence.step is not None else min(len(a.losses), len(b.losses), limit)
    start = max(0, end - (before + 1)) if divergence and divergence.step is not None else 0
    rows: list[CurveRow] = []
    for index in range(start, min(end + 1, max(len(a.losses), len(b.losses)))):
        x = a.losses[index] if index < len(a.losses) else None
        y = b.losses[index] if index < len(b.losses) else None
        rows.append(CurveRow(step=index + 1, first=_fmt(x) if x is not None else "—", second=_fmt(y) if y is not None else "—", same=same_value(x, y)))
    return rows[:limit]


def rng_causes(a: RunData, b: RunData) -> list[SeedingCause]:
    """Seeding calls that explain two runs diverging under the same hash seed: generators seeded
    from the OS's entropy, and seeds whose value differed between the runs."""
    causes: list[SeedingCause] = []
    seen: set[tuple[Any, ...]] = set()
    first, second = a.seeding, b.seeding
    for record in first + second:
        marker = (record.api, record.site.path, record.site.line)
        if record.entropy and marker not in seen:
            seen.add(marker)
            causes.append({"api": record.api, "site": site_record(record.site), "why": "seeded from the OS's entropy", "seeds": [record.seed]})
    paired: dict[tuple[Any, ...], list[Any]] = {}
    for records, slot in ((first, 0), (second, 1)):
        counts: Counter[tuple[Any, ...]] = Counter()
        for record in records:
            base = (record.api, record.site.path, record.site.line)
            counts[base] += 1
            paired.setdefault((*base, counts[base]), [None, None, site_record(record.site)])[slot] = record.seed
    for (api, path, line, _n), (x, y, site) in paired.items():
        if x is not None and y is not None and x != y and (api, path, line) not in seen:
            seen.add((api, path, line))
            causes.append({"api": api, "site": site, "why": "seeded with a value that changed between the runs", "seeds": [x, y]})
    return causes


def deterministic_op(run: EntrypointRun) -> RefusedOp | None:
    """The op torch.use_deterministic_algorithms(True) refused, with the target's frame."""
    exc = run.raised
    if exc is None:
        return None
    match = _DETERMINISTIC_OP.search(exc.message)
    if not match:
        return None
    frame = exc.target_frame
    return {"op": match.group(1).strip(), "message": exc.message[:600], "site": site_record(frame) if frame is not None else None}


KIND_TEXT: dict[str, tuple[str, str]] = {
    "hash-order": (
        "Training results depend on PYTHONHASHSEED (hash iteration order)",
        "Iterate sets in a defined order (`sorted(set_of_words)`), build vocabularies and index maps from sorted keys, and never let set order decide ids, batches or parameter order.",
    ),
    "unseeded-random": (
        "Training is not reproducible: a random source ignores the configured seed",
        "Seed every generator from the configured seed (`torch.Generator().manual_seed(seed)`, `numpy.random.default_rng(seed)`, `random.Random(seed)`), never from time or the OS's entropy.",
    ),
    "nondeterministic-op": (
        "Training is not reproducible: an op without a deterministic implementation",
        "Enable `torch.use_deterministic_algorithms(True)` (with CUBLAS_WORKSPACE_CONFIG=:4096:8 on CUDA) and replace the op it names, or accept and document the nondeterminism.",
    ),
    "same-hash-unlocated": (
        "Training is not reproducible with the same seeds",
        "Look for randomness that is not derived from the configured seed (clock-based seeds, os.urandom, uuid, thread timing, iteration over sets of objects) on the path the divergence starts from.",
    ),
    "race": (
        "Training is not reproducible: a CUDA race feeds it",
        "Fix the race this stage reports (synchronise before reading a non_blocking copy; make a stream wait for the stream that wrote its input), then rerun the gate.",
    ),
    "unclassified": (
        "Training is not reproducible with the same seeds",
        "Compare the two runs' steps around the first divergence; the stage could not tell hash-order dependence from an unseeded source (no budget left, or the run that tells them apart failed).",
    ),
}


def nondeterminism_finding(
    ctx: StageContext,
    kind: str,
    divergence: Divergence,
    pair: tuple[RunData, RunData],
    location: Location | None,
    explanation: str,
    data: NondeterminismData,
) -> Finding:
    title, fix = KIND_TEXT[kind]
    a, b = pair
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH,
        title=title,
        location=location,
        problem=(
            f"Two runs of the entrypoint with the same seed (PYTHONHASHSEED={a.hash_seed} and {b.hash_seed}) diverged at "
            f"{divergence.describe()}. {explanation}"
        ),
        fix=fix,
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"{a.label} vs {b.label}: first difference at {divergence.describe()}",
            data={
                "kind": kind,
                "where": divergence.where,
                "first_divergent_step": divergence.step + 1 if divergence.step is not None else None,
                "values": divergence.shown_values(),
                "returned_key": divergence.key,
                "hash_seeds": [a.hash_seed, b.hash_seed],
                "runs": [a.label, b.label],
                **data,
            },
        ),
        key=f"{kind}:{location.path if location else ''}:{data.get('site_code', '')}",
    )


def returned_only_finding(ctx: StageContext, divergence: Divergence, pair: tuple[RunData, RunData], location: Location | None) -> Finding:
    """Two runs trained identically (same losses, same parameters step by step) and returned
    something different: not what training computes, so info, never blocking."""
    a, b = pair
    steps = len(a.fingerprinted)
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.INFO,
        title="A returned value differs between two identical training runs",
        location=location,
        problem=(
            f"Two runs with the same seed (PYTHONHASHSEED={a.hash_seed} and {b.hash_seed}) computed the same {len(a.losses)} step losses and the same "
            f"parameters after each of {steps} optimizer steps, but returned different values: {divergence.describe()}. "
            "Training is reproducible; the returned value holds something that is not (a timing or a counter under another name?)."
        ),
        impact="None for training; anything that compares returned values between runs (a regression check, a cache key) sees a difference.",
        fix="Nothing to fix in training. If the value is a timing, name it like one (`*_duration`, `*_time`, `*_per_sec`) so comparisons leave it out.",
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"{a.label} vs {b.label}: identical losses and parameters; returned `{divergence.key}` differs",
            data={"kind": "returned-only", "where": divergence.where, "values": divergence.shown_values(), "returned_key": divergence.key, "hash_seeds": [a.hash_seed, b.hash_seed], "runs": [a.label, b.label]},
        ),
        key=f"returned-only:{divergence.key}",
    )

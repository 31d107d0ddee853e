"""ddp-divergence and the distributed run's hang: what the ranks of one torchrun run report,
compared.

- parameters: a parameter whose digest differs between ranks after training. The cause, when
  observable: no DistributedDataParallel built (each rank trains its own copy), the
  parameter outside the wrapped module, and weights that already differed before the first
  step with a `torch.manual_seed` that got a different seed on each rank (located there);
- BatchNorm running statistics that differ between ranks where nothing synchronises them (no
  DDP around them, or DDP with `broadcast_buffers=False`, and no SyncBatchNorm). With
  `broadcast_buffers=True` DDP overwrites them with rank 0's at every forward, so a difference
  after the last forward is expected and not reported;
- data: a training DataLoader (one that fed optimizer steps on every rank) that handed every
  rank the same batches, digest for digest (no DistributedSampler, or one given the same rank);
- hang: ranks still running at the timeout; the finding is located at the line where the
  waiting rank waits, with every rank's stacks and collective calls in the evidence.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from traingate.pipeline.model.findings import hang
from traingate.stages.common.stacks import main_thread_frames
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, innermost_target_frame, location_of
from traingate.stages.contract.messages import CollectiveCall, DistributedRecord, RankResult
from traingate.stages.contract.payloads.base import Site
from traingate.stages.correctness.probe.payloads import RankLoader, RanksPayload, RankTensor
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import DDP_DIVERGENCE

CATEGORY = DDP_DIVERGENCE
BATCH_NORMS = frozenset({"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d"})
MAX_NAMED = 20
_STACKS_EVIDENCE = 40000


def divergence_findings(ctx: StageContext, watches: Sequence[RanksPayload], fallback: Location) -> list[Finding]:
    """Findings from every rank's RankWatch payload, in rank order."""
    payloads = list(watches)
    findings = _parameter_findings(ctx, payloads, fallback)
    if not findings:
        findings = _buffer_findings(ctx, payloads, fallback)
    return findings + _data_findings(ctx, payloads, fallback)


def differing_parameters(watches: Sequence[RanksPayload]) -> int:
    """How many parameters do not have the same bytes on every rank."""
    return len(_differing(watches, "parameter"))


def _differing(watches: Sequence[RanksPayload], kind: str) -> list[tuple[RankTensor, float | None]]:
    """(rank 0's record, the largest absolute difference from rank 0 over the compared values)
    of every tensor of `kind` whose digest is not the same on every rank, in rank 0's order."""
    others = [{t.name: t for t in w.tensors} for w in watches[1:]]
    found = []
    for tensor in watches[0].tensors:
        if tensor.kind != kind:
            continue
        peers = [o.get(tensor.name) for o in others]
        if all(p is not None and p.digest == tensor.digest for p in peers):
            continue
        found.append((tensor, _max_difference(tensor, [p for p in peers if p is not None])))
    return found


def _max_difference(tensor: RankTensor, peers: list[RankTensor]) -> float | None:
    largest: float | None = None
    for peer in peers:
        if peer.shape != tensor.shape:
            continue
        for a, b in zip(tensor.values, peer.values, strict=False):
            if isinstance(a, float) and isinstance(b, float):
                largest = max(largest or 0.0, abs(a - b))
    return largest


def _parameter_findings(ctx: StageContext, watches: Sequence[RanksPayload], fallback: Location) -> list[Finding]:
    differing = _differing(watches, "parameter")
    if not differing:
        return []
    first, difference = differing[0]
    rank0 = watches[0]
    wrapped = bool(rank0.ddp)
    initial_differs = any(w.initial.get(first.name) != rank0.initial.get(first.name) for w in watches[1:])
    seed = _rank_dependent_seed(watches)
    causes = []
    location = located.location(rank0, first.site, fallback)
    if initial_differs:
        if seed is not None:
            where, seeds = seed
            causes.append(f"the weights already differed before the first optimizer step: `{where.code}` seeds each rank differently ({seeds})")
            location = location_of(where) or fallback
        else:
            causes.append("the weights already differed before the first optimizer step (initialised differently on each rank)")
    if not wrapped:
        causes.append("no DistributedDataParallel was built, so nothing broadcasts rank 0's weights or averages the gradients: each rank trains its own copy")
    elif not first.in_ddp:
        causes.append(f"the parameter is not in the module DistributedDataParallel wraps ({', '.join(d.module for d in rank0.ddp)}), so its gradients are never averaged")
    shown = ", ".join(f"`{t.name}`" for t, _ in differing[:5]) + (f" and {len(differing) - 5} more" if len(differing) > 5 else "")
    how_much = f"{difference:.3g}" if difference is not None else "unknown (no comparable values)"
    title = f"Model parameters differ across the {len(watches)} ranks after training: `{first.name}` first, by up to {how_much}"
    if not wrapped:
        title += " (the model is not wrapped in DistributedDataParallel)"
    return [
        ctx.finding(
            category=CATEGORY,
            severity=Severity.HIGH,
            title=title,
            location=location,
            problem=(
                f"After training under torchrun, {len(differing)} parameter(s) are not the same on every rank: {shown}. "
                f"The first, `{first.name}` ({first.module}, shape {first.shape}), differs from rank 0's by up to {how_much}"
                + (" over its sampled elements" if first.sampled else "")
                + "." + (" " + _sentence("; ".join(causes)) if causes else "")
            ),
            evidence=Evidence(
                kind=EvidenceKind.OBSERVED,
                summary=f"{len(differing)} parameter(s) with different bytes on the ranks; max |difference| {how_much} in `{first.name}`",
                data={
                    "reason": "parameters",
                    "first_parameter": first.name,
                    "max_abs_difference": difference,
                    "parameters": [{"name": t.name, "module": t.module, "max_abs_difference": d, "in_ddp": t.in_ddp} for t, d in differing[:MAX_NAMED]],
                    "parameters_differing": len(differing),
                    "initial_weights_differ": initial_differs,
                    "ddp_wrappers": [located.record(d) for d in rank0.ddp],
                    "rank_dependent_seed": {**located.record(seed[0]), "seeds": seed[1]} if seed is not None else None,
                    "steps_per_rank": [w.steps for w in watches],
                },
            ),
            key=f"parameters:{first.name}",
        )
    ]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _rank_dependent_seed(watches: Sequence[RanksPayload]) -> tuple[Site, list[int]] | None:
    """The first `torch.manual_seed` line that got a different seed on some rank, and the seed
    each rank got there."""
    calls = [[(located.site(w, s.site), s.seed) for s in w.seeds] for w in watches]
    for index, (where, value) in enumerate(calls[0]):
        if where is None:
            continue
        seeds = [value] + [other[index][1] for other in calls[1:] if index < len(other)]
        if len(set(seeds)) > 1:
            return where, seeds
    return None


def _buffer_findings(ctx: StageContext, watches: Sequence[RanksPayload], fallback: Location) -> list[Finding]:
    rank0 = watches[0]
    broadcast = {d.module: d.broadcast_buffers for d in rank0.ddp}
    unsynced = [
        (t, d) for t, d in _differing(watches, "buffer")
        if t.module in BATCH_NORMS and not (t.in_ddp and all(broadcast.values()))
    ]
    if not unsynced:
        return []
    first, difference = unsynced[0]
    how_much = f"{difference:.3g}" if difference is not None else "unknown"
    why = "no DistributedDataParallel wraps them" if not first.in_ddp else "DistributedDataParallel was built with broadcast_buffers=False"
    return [
        ctx.finding(
            category=CATEGORY,
            severity=Severity.HIGH,
            title=f"BatchNorm running statistics differ across the {len(watches)} ranks: `{first.name}` by up to {how_much} (unsynchronised BatchNorm)",
            location=located.location(rank0, first.module_site, fallback),
            problem=(
                f"The parameters are the same on every rank, but {len(unsynced)} BatchNorm buffer(s) are not, `{first.name}` first: "
                f"each rank keeps running statistics of its own batches only, and {why}, so the model each rank would save or evaluate differs."
            ),
            fix="Convert the model with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping it, or keep DistributedDataParallel's broadcast_buffers=True.",
            evidence=Evidence(
                kind=EvidenceKind.OBSERVED,
                summary=f"{len(unsynced)} BatchNorm buffer(s) with different bytes on the ranks",
                data={"reason": "batchnorm-buffers", "buffers": [{"name": t.name, "max_abs_difference": d} for t, d in unsynced[:MAX_NAMED]], "ddp_wrappers": [located.record(d) for d in rank0.ddp]},
            ),
            key=f"buffers:{first.name}",
        )
    ]


def _data_findings(ctx: StageContext, watches: Sequence[RanksPayload], fallback: Location) -> list[Finding]:
    """A training loader, matched across ranks by the line that built it, that handed every
    rank the same batches."""
    findings = []
    rank0 = watches[0]
    for loader in rank0.loaders:
        where = located.site(rank0, loader.site)
        if where is None or not loader.steps or not loader.digests:
            continue
        peers = [_loader_at(w, where) for w in watches[1:]]
        if any(p is None or not p.steps for p in peers):
            continue
        compared = min(len(loader.digests), *(len(p.digests) for p in peers if p is not None))
        if compared == 0 or any(p is not None and p.digests[:compared] != loader.digests[:compared] for p in peers):
            continue
        sampler = loader.sampler
        cause = (
            f"its sampler is a {sampler}, not a DistributedSampler, so every rank iterates the whole dataset in the same order"
            if sampler != "DistributedSampler"
            else "its DistributedSampler gives every rank the same share (num_replicas or rank set to the same value on every rank)"
        )
        findings.append(
            ctx.finding(
                category=CATEGORY,
                severity=Severity.HIGH,
                title=f"Every rank trained on the same batches: the DataLoader at {where.path}:{where.line} has no DistributedSampler" if sampler != "DistributedSampler"
                else f"Every rank trained on the same batches from the DataLoader at {where.path}:{where.line}",
                location=located.location(rank0, loader.site, fallback),
                problem=(
                    f"The first {compared} batch(es) this DataLoader handed out are identical on all {len(watches)} ranks: {cause}. "
                    f"The ranks compute the same gradients, so {len(watches)} processes do the work of one and an epoch is not the dataset once."
                    + (f" The loader is built at `{where.code}`." if where.code else "")
                ),
                fix="Give the training DataLoader sampler=DistributedSampler(dataset) (and no shuffle=True; the sampler shuffles), and call sampler.set_epoch(epoch) every epoch.",
                evidence=Evidence(
                    kind=EvidenceKind.OBSERVED,
                    summary=f"{compared} batch digest(s) compared, identical on every rank; sampler {sampler}",
                    data={"reason": "same-data", "sampler": sampler, "batches_compared": compared, "batches_per_rank": [loader.batches, *(p.batches for p in peers if p is not None)], "loader_site": located.record(where)},
                ),
                key=f"same-data:{where.path}:{where.line}",
            )
        )
    return findings


def _loader_at(watch: RanksPayload, where: Site) -> RankLoader | None:
    for loader in watch.loaders:
        site = located.site(watch, loader.site)
        if site is not None and (site.path, site.line) == (where.path, where.line):
            return loader
    return None


# -- hang ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Skipped:
    """A collective's calling line that one rank called more often than another."""

    function: str
    path: str
    line: int
    rank: int  # the running rank with the most calls there: it waits in it
    most: int
    fewest_rank: int
    fewest: int


def distributed_hang(ctx: StageContext, record: DistributedRecord, fallback: Location, what: str) -> Finding:
    """`hang` of a distributed run: located where the waiting rank waits, every rank's stacks
    and collective calls in the evidence."""
    ranks = record.ranks
    running = [r for r in ranks if not r.reported and r.stacks]
    waiting, skipped = _waiting_rank(ranks, running, ctx.root)
    location: Location | None = None
    if waiting is not None:
        location = innermost_target_frame(main_thread_frames(waiting.stacks), ctx.root)
    lines = []
    for rank in ranks:
        frames = main_thread_frames(rank.stacks)
        where = innermost_target_frame(frames, ctx.root)
        if rank.reported:
            lines.append(f"rank {rank.rank} {rank.ending} from the entrypoint and waited for the other ranks to finish")
        elif where is not None:
            lines.append(f"rank {rank.rank} waits at {where.path}:{where.line} (in {frames[0].function})")
        else:
            lines.append(f"rank {rank.rank} {rank.ending}" + (f" (in {frames[0].function}, outside the target's code)" if frames else ""))
    mismatch = ""
    if skipped is not None:
        mismatch = (
            f" `{skipped.function}` at {skipped.path}:{skipped.line} was called {skipped.most} time(s) on rank {skipped.rank} "
            f"but {skipped.fewest} time(s) on rank {skipped.fewest_rank}: a collective one rank skips leaves the others waiting for it."
        )
    share = _STACKS_EVIDENCE // max(1, len(ranks))  # every rank's dump, each cut to its share from the top
    stacks = "\n".join(f"===== rank {r.rank} ({r.ending}) =====\n{(r.stacks or '(no stack: it was not running)')[:share]}" for r in ranks)
    waiting_text = f"rank {waiting.rank}" if waiting is not None else "no rank in the target's code"
    return hang(
        ctx,
        what,
        run="distributed",
        severity=Severity.CRITICAL,
        title=f"{what} did not finish within {record.timeout_s:g}s: {waiting_text} waits" + (f" in `{skipped.function}`" if skipped else ""),
        location=location or fallback,
        problem=f"{what} was still running after {record.timeout_s:g}s: " + "; ".join(lines) + "." + mismatch,
        fix="Make every rank call the same collectives in the same order: no collective inside a branch on the rank or on data that differs between ranks (log on rank 0 after the all_reduce, not around it).",
        summary=f"{len(running)} rank(s) still running at the timeout; every rank's stacks dumped, then all killed",
        stacks=stacks,
        data={
            "waiting_rank": waiting.rank if waiting is not None else None,
            "skipped_collective": asdict(skipped) if skipped is not None else None,
            "ranks": [{"rank": r.rank, "pid": r.pid, "ending": r.ending, "collectives": r.collectives} for r in ranks],
            "timeout_s": record.timeout_s,
        },
    )


def _waiting_rank(ranks: list[RankResult], running: list[RankResult], root: Path) -> tuple[RankResult | None, _Skipped | None]:
    """The rank that waits, and the collective call one rank made more often than another.

    A calling line whose count differs between ranks is a collective some rank skipped; the
    running rank with the most calls there waits in it. Without such a line: the first
    running rank whose main thread is in the target's code."""
    counts: defaultdict[tuple[str, str, int], Counter[int]] = defaultdict(Counter)  # calls by line, then by rank
    for rank in ranks:
        for call in map(CollectiveCall.model_validate, rank.collectives):
            counts[(call.function, call.path, call.line)][rank.rank] = call.calls
    running_ids = {r.rank for r in running}
    for (function, path, line), by_rank in counts.items():
        full = {r.rank: by_rank[r.rank] for r in ranks}
        if len(set(full.values())) < 2:
            continue
        most_rank = max((r for r in full if r in running_ids), key=lambda r: full[r], default=None)
        if most_rank is None:
            continue
        fewest_rank = min(full, key=lambda r: full[r])
        skipped = _Skipped(function=function, path=path, line=line, rank=most_rank, most=full[most_rank], fewest_rank=fewest_rank, fewest=full[fewest_rank])
        return next(r for r in ranks if r.rank == most_rank), skipped
    in_target = [r for r in running if innermost_target_frame(main_thread_frames(r.stacks), root) is not None]
    candidates = in_target or running
    return (candidates[0] if candidates else None), None

"""`dataloader-hazard`: what the target's DataLoaders did in the instrumented run.

Reported only from observations of `traingate.stages.concurrency.probe.loaders.LoaderWatch`:
- a loader whose settings DataLoader rejected (prefetch_factor or persistent_workers with
  num_workers=0);
- a worker that died, timed out or raised while the training iterated the loader;
- a loader that works under the start method the run used (fork on Linux) but not under
  another one (spawn, the default on macOS and Windows and under CUDA-safe launchers): its
  dataset, collate_fn or worker_init_fn cannot be pickled (one finding per unpicklable object,
  at the line that defines it, listing every loader it breaks), or the worker fails to load a batch;
- a loader with persistent_workers=True re-created at the same line, which restarts its
  workers each time (medium), and leaks them when the live worker count keeps growing (high).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traingate.stages.concurrency.details import LoaderDetails, LoaderRow, StartMethodRow
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, location_of
from traingate.stages.contract.payloads.base import Payload
from traingate.stages.contract.payloads.base import Site
from traingate.stages.concurrency.probe.payloads import (
    BatchFailed,
    BatchLoaded,
    ConstructionError,
    Culprit,
    IterationError,
    LoaderPayload,
    LoaderRecord,
    PickleFailed,
    StartMethodCheck,
)
from traingate.stages.concurrency.rules import DATALOADER_HAZARD

CATEGORY = DATALOADER_HAZARD



def _code(site: Site | None) -> str:
    return site.code if site else ""


def as_sent(record: Payload | None) -> dict[str, Any] | None:
    """A record of the payload as the probe sent it (the keys it left out still left out),
    for evidence and details."""
    return record.model_dump(mode="json", exclude_unset=True) if record is not None else None


def loader_findings(ctx: StageContext, watch: LoaderPayload, fallback: Location | None) -> list[Finding]:
    findings: list[Finding] = []
    findings += [_rejected(ctx, e, fallback) for e in watch.construction_errors]
    findings += [_worker_failure(ctx, e, fallback) for e in watch.errors if e.kind != "other"]
    loaders = {_site_key(loader.site): loader for loader in watch.loaders}
    # A loader whose own workers already failed in the run fails under another start method
    # for the same cause: that is the finding above, not a second one saying it "works under fork".
    failed = {_site_key(e.site) for e in watch.errors if e.kind != "other"}
    probed = [c for c in watch.start_method_checks if _site_key(c.site) not in failed]
    for group in _start_method_groups(probed):
        findings.append(_start_method_failure(ctx, group, [loaders.get(_site_key(c.site)) for c in group], fallback))
    for loader in watch.loaders:
        recreated = _recreated_persistent(ctx, loader, fallback)
        if recreated is not None:
            findings.append(recreated)
    return findings


def _rejected(ctx: StageContext, error: ConstructionError, fallback: Location | None) -> Finding:
    site = error.site
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH,
        title=f"DataLoader rejected its settings: {error.message[:120]}",
        location=location_of(site) or fallback,
        problem=f"Constructing the DataLoader raised {error.type}: {error.message}",
        impact="The training stops before its first batch whenever this line runs.",
        fix="Only pass prefetch_factor and persistent_workers=True together with num_workers > 0 (or drop them when num_workers is 0).",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"{error.type} at construction", data={"settings": dict(error.settings), "error": error.message}),
        key=f"rejected:{error.type}:{_code(site)}",
    )


_WORKER_TEXT = {
    "worker-died": ("A DataLoader worker died", "A worker process exited while the training waited for its batch", "Find why the worker died (out of memory, a native crash in the dataset, shared memory too small in a container) in the message below."),
    "worker-timeout": ("A DataLoader worker hung", "No batch arrived within the loader's timeout", "Find what the worker waits for (a lock inherited through fork, a network read) and remove it; keep the timeout so a hang fails fast."),
    "worker-exception": ("A DataLoader worker raised", "A worker raised while loading a batch", "Fix the dataset or collate_fn code at the location shown; the worker's traceback is below."),
}


def _worker_failure(ctx: StageContext, error: IterationError, fallback: Location | None) -> Finding:
    title, problem, fix = _WORKER_TEXT[error.kind]
    site = error.worker_site or error.site
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH,
        title=title,
        location=location_of(site) or fallback,
        problem=f"{problem}: {error.type}: {error.message.splitlines()[0][:300] if error.message else ''}",
        fix=fix,
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{error.type} from the loader built at {_where(error.site)}",
            traceback=error.message,
            data={"settings": as_sent(error.settings), "loader_site": as_sent(error.site), "kind": error.kind},
        ),
        key=f"{error.kind}:{error.type}:{_code(site)}",
    )


def _where(site: Site | None) -> str:
    return f"{site.path}:{site.line}" if site else "an unknown line"


def _site_key(site: Site | None) -> tuple[str | None, int | None]:
    return (site.path, site.line) if site else (None, None)


def _start_method_groups(checks: list[StartMethodCheck]) -> list[list[StartMethodCheck]]:
    """Failed start-method checks, one group per fix: every loader broken by the same object
    that cannot be pickled (one lambda breaks the train and the val loader) is one group;
    a worker that fails for another reason is a group of its own."""
    groups: dict[Any, list[StartMethodCheck]] = {}
    for check in checks:
        if check.batch.ok or check.batch.slow_start:
            continue  # the pickling probe alone is a hint; a worker that loads a batch is the answer
        culprit = _culprit_of(check)
        defined = culprit.defined_at if culprit else None
        if defined:
            key: Any = ("defined", _site_key(defined))
        elif culprit:
            key = ("attribute", culprit.type, culprit.attribute, check.method)
        else:
            key = ("site", _site_key(check.site), check.method)
        groups.setdefault(key, []).append(check)
    return list(groups.values())


def _culprit_of(check: StartMethodCheck) -> Culprit | None:
    return check.pickle.culprit if isinstance(check.pickle, PickleFailed) else None


@dataclass(frozen=True)
class _Broken:
    """What one group of failed start-method checks broke: the start methods tried, the one the
    run used, how many batches the loader loaded under it, and the loaders' lines."""

    method: str  # the first start method that failed
    methods: list[str]
    used: str
    batches: int
    sites: list[str]

    @classmethod
    def of(cls, group: list[StartMethodCheck], loader: LoaderRecord | None) -> _Broken:
        check = group[0]
        return cls(
            method=check.method, methods=list(dict.fromkeys(c.method for c in group)), used=check.used or "fork",
            batches=loader.batches if loader else 0, sites=list(dict.fromkeys(_where(c.site) for c in group)),
        )

    def works(self) -> str:
        return f"it loaded {self.batches} batch(es) under `{self.used}` in the same run" if self.batches else f"the run used `{self.used}`"

    def loaders(self) -> str:
        return f"the DataLoader built at {self.sites[0]}" if len(self.sites) == 1 else f"{len(self.sites)} DataLoaders (built at {', '.join(self.sites)})"


@dataclass(frozen=True)
class _Cause:
    """Why the workers failed, as the finding says it."""

    title: str
    problem: str
    fix: str
    error: str  # the error the evidence summarises
    location: Location | None
    key: str


def _start_method_failure(ctx: StageContext, group: list[StartMethodCheck], loaders: list[LoaderRecord | None], fallback: Location | None) -> Finding:
    """One finding per group of loaders broken the same way under another start method: by an
    object that cannot be pickled (at the line that defines it), or a worker that fails to load."""
    check = group[0]
    batch = check.batch
    assert isinstance(batch, BatchFailed)  # only failed checks are grouped
    broken = _Broken.of(group, loaders[0])
    pickled = check.pickle
    cause = _unpicklable(check, pickled, batch, broken, fallback) if isinstance(pickled, PickleFailed) else _worker_fails(check, batch, broken, fallback)
    method = broken.method
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH,
        title=cause.title,
        location=cause.location,
        problem=cause.problem,
        impact=f"The training crashes at its first batch wherever workers start with `{method}`: macOS and Windows by default, Python 3.14 on Linux (forkserver), and launchers that avoid fork with CUDA.",
        fix=cause.fix,
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{method}: {cause.error.splitlines()[0][:200] if cause.error else 'failed'}",
            traceback=batch.error,
            data=_start_method_data(group, loaders, broken),
        ),
        key=cause.key,
    )


def _unpicklable(check: StartMethodCheck, pickled: PickleFailed, batch: BatchFailed, broken: _Broken, fallback: Location | None) -> _Cause:
    """A worker receives the dataset (or collate_fn, worker_init_fn) pickled, and something it holds cannot be."""
    culprit = pickled.culprit
    defined = culprit.defined_at if culprit else None
    what = f"`{culprit.attribute}` ({culprit.type}{', defined at ' + _where(defined) if defined else ''})" if culprit else f"the {pickled.object}"
    works = broken.works()
    problem = (
        f"Under the `{'`/`'.join(broken.methods)}` start method each worker receives the {pickled.object} pickled, and {what} cannot be pickled: "
        f"{pickled.error}. This breaks {broken.loaders()}. Loading one batch with multiprocessing_context=\"{broken.method}\" failed with {batch.error[:200]}. {works[0].upper() + works[1:]}."
    )
    loaders_text = "its DataLoader fails" if len(broken.sites) == 1 else f"{len(broken.sites)} DataLoaders fail"
    return _Cause(
        title=f"{what.split(' (')[0]} cannot be pickled: {loaders_text} under `{broken.method}` (fine under `{broken.used}`)",
        problem=problem,
        fix="Replace lambdas and local functions held by the dataset (or passed as collate_fn/worker_init_fn) with module-level functions or callable classes, so the loader works under every start method.",
        error=pickled.error,
        location=location_of(defined) or location_of(check.site) or fallback,
        key=f"start-method:unpicklable:{_code(defined) or culprit.attribute}" if culprit else f"start-method:{broken.method}:{_code(check.site)}",
    )


def _worker_fails(check: StartMethodCheck, batch: BatchFailed, broken: _Broken, fallback: Location | None) -> _Cause:
    """The dataset pickles, but a worker started another way fails to load a batch."""
    method = broken.method
    return _Cause(
        title=f"DataLoader works under `{broken.used}` but fails under `{method}`",
        problem=f"A worker started with `{method}` failed to load one batch ({batch.error[:300]}); {broken.works()}.",
        fix="Make the dataset self-contained: state set up at run time in the main process (globals, open handles) is not there in a spawned worker; build it in __init__ or worker_init_fn.",
        error=batch.error,
        location=location_of(check.site) or fallback,
        key=f"start-method:{method}:{_code(check.site)}",
    )


def _start_method_data(group: list[StartMethodCheck], loaders: list[LoaderRecord | None], broken: _Broken) -> dict[str, Any]:
    """The evidence's data: the start methods, the first check's probes and every loader broken."""
    check, loader = group[0], loaders[0]
    return {
        "start_method": broken.method,
        "start_methods": broken.methods,
        "used": broken.used,
        "batches_under_used": broken.batches,
        "pickle": as_sent(check.pickle) or {"ok": True},
        "batch": as_sent(check.batch),
        "settings": as_sent(loader.settings) if loader else None,
        "loaders": [{"site": as_sent(c.site), "method": c.method, "settings": as_sent(lo.settings) if lo else None} for c, lo in zip(group, loaders, strict=True)],
    }


def _batch_error(batch: BatchLoaded | BatchFailed) -> str | None:
    if not isinstance(batch, BatchFailed):
        return None
    if batch.slow_start:
        return f"not measured: the worker had not started when the probe gave up after {batch.seconds:.0f}s (a busy machine starts an interpreter slowly); {batch.error}"
    return batch.error


def _recreated_persistent(ctx: StageContext, loader: LoaderRecord, fallback: Location | None) -> Finding | None:
    settings = loader.settings
    if not (settings.persistent_workers and settings.num_workers > 0 and loader.constructions >= 2 and loader.iterations >= 2):
        return None
    live = loader.live_workers
    leak = len(live) >= 2 and live[-1] - live[0] >= settings.num_workers
    site = loader.site
    problem = (
        f"The DataLoader at this line was constructed {loader.constructions} times with persistent_workers=True and "
        f"num_workers={settings.num_workers}, so its workers were started anew for every construction."
    )
    if leak:
        problem += f" The workers of earlier loaders stayed alive: live worker processes grew from {live[0]} to {live[-1]}."
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH if leak else Severity.MEDIUM,
        title="Persistent DataLoader re-created every epoch" + (" (its workers leak)" if leak else ""),
        location=location_of(site) or fallback,
        problem=problem,
        impact=("Worker processes and their memory accumulate until the machine runs out." if leak else "Each epoch pays the worker start-up that persistent_workers exists to avoid."),
        fix="Construct the DataLoader once, before the epoch loop, and iterate it each epoch.",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{loader.constructions} constructions, {loader.iterations} iterations; live workers {live[:10]}",
            data={"settings": as_sent(settings), "constructions": loader.constructions, "iterations": loader.iterations, "live_workers": list(live)},
        ),
        key=f"recreated-persistent:{_code(site)}",
    )


def loader_details(watch: LoaderPayload, start_methods: list[str]) -> LoaderDetails:
    """The check's record for the report (`start_methods`: the configured ones)."""
    return LoaderDetails(
        ran=True,
        loaders=[
            LoaderRow(
                site=loader.site, settings=loader.settings, constructions=loader.constructions, iterations=loader.iterations,
                batches=loader.batches, live_workers=loader.live_workers[:10],
            )
            for loader in watch.loaders
        ],
        start_method_checks=[
            StartMethodRow(
                site=c.site,
                method=c.method,
                used=c.used,
                ok=c.batch.ok,
                pickled=c.pickle.ok if c.pickle is not None else True,
                seconds=c.batch.seconds,
                error=(c.pickle.error if isinstance(c.pickle, PickleFailed) else None) or _batch_error(c.batch),
            )
            for c in watch.start_method_checks
        ],
        errors=len(watch.errors) + len(watch.construction_errors),
        start_methods=start_methods,
    )

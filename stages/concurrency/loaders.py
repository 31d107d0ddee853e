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

from typing import Any

from traingate.pipeline.schema import Category, Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext

CATEGORY = Category.DATALOADER_HAZARD


def _location(site: dict[str, Any] | None, fallback: Location | None) -> Location | None:
    if not site:
        return fallback
    return Location(path=site["path"], line=site["line"], function=site.get("function"))


def _code(site: dict[str, Any] | None) -> str:
    return str((site or {}).get("code", ""))


def loader_findings(ctx: StageContext, watch: dict[str, Any], fallback: Location | None) -> list[Finding]:
    findings: list[Finding] = []
    findings += [_rejected(ctx, e, fallback) for e in watch.get("construction_errors", [])]
    findings += [_worker_failure(ctx, e, fallback) for e in watch.get("errors", []) if e.get("kind") != "other"]
    loaders = {_site_key(loader["site"]): loader for loader in watch.get("loaders", [])}
    for group in _start_method_groups(watch.get("start_method_checks", [])):
        findings.append(_start_method_failure(ctx, group, [loaders.get(_site_key(c.get("site"))) for c in group], fallback))
    for loader in watch.get("loaders", []):
        recreated = _recreated_persistent(ctx, loader, fallback)
        if recreated is not None:
            findings.append(recreated)
    return findings


def _rejected(ctx: StageContext, error: dict[str, Any], fallback: Location | None) -> Finding:
    site = error.get("site")
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH,
        title=f"DataLoader rejected its settings: {error['message'][:120]}",
        location=_location(site, fallback),
        problem=f"Constructing the DataLoader raised {error['type']}: {error['message']}",
        impact="The training stops before its first batch whenever this line runs.",
        fix="Only pass prefetch_factor and persistent_workers=True together with num_workers > 0 (or drop them when num_workers is 0).",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"{error['type']} at construction", data={"settings": error.get("settings", {}), "error": error["message"]}),
        key=f"rejected:{error['type']}:{_code(site)}",
    )


_WORKER_TEXT = {
    "worker-died": ("A DataLoader worker died", "A worker process exited while the training waited for its batch", "Find why the worker died (out of memory, a native crash in the dataset, shared memory too small in a container) in the message below."),
    "worker-timeout": ("A DataLoader worker hung", "No batch arrived within the loader's timeout", "Find what the worker waits for (a lock inherited through fork, a network read) and remove it; keep the timeout so a hang fails fast."),
    "worker-exception": ("A DataLoader worker raised", "A worker raised while loading a batch", "Fix the dataset or collate_fn code at the location shown; the worker's traceback is below."),
}


def _worker_failure(ctx: StageContext, error: dict[str, Any], fallback: Location | None) -> Finding:
    title, problem, fix = _WORKER_TEXT[error["kind"]]
    site = error.get("worker_site") or error.get("site")
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH,
        title=title,
        location=_location(site, fallback),
        problem=f"{problem}: {error['type']}: {error['message'].splitlines()[0][:300] if error['message'] else ''}",
        fix=fix,
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{error['type']} from the loader built at {_where(error.get('site'))}",
            traceback=error["message"],
            data={"settings": error.get("settings"), "loader_site": error.get("site"), "kind": error["kind"]},
        ),
        key=f"{error['kind']}:{error['type']}:{_code(site)}",
    )


def _where(site: dict[str, Any] | None) -> str:
    return f"{site['path']}:{site['line']}" if site else "an unknown line"


def _site_key(site: dict[str, Any] | None) -> tuple[Any, Any]:
    return (site or {}).get("path"), (site or {}).get("line")


def _start_method_groups(checks: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Failed start-method checks, one group per fix: every loader broken by the same object
    that cannot be pickled (one lambda breaks the train and the val loader) is one group;
    a worker that fails for another reason is a group of its own."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for check in checks:
        if (check.get("batch") or {"ok": True})["ok"]:
            continue  # the pickling probe alone is a hint; a worker that loads a batch is the answer
        culprit = _culprit_of(check)
        defined = (culprit or {}).get("defined_at")
        if defined:
            key: Any = ("defined", _site_key(defined))
        elif culprit:
            key = ("attribute", culprit.get("type"), culprit.get("attribute"), check.get("method"))
        else:
            key = ("site", _site_key(check.get("site")), check.get("method"))
        groups.setdefault(key, []).append(check)
    return list(groups.values())


def _culprit_of(check: dict[str, Any]) -> dict[str, Any] | None:
    pickled = check.get("pickle") or {"ok": True}
    return None if pickled["ok"] else (pickled.get("culprit") or None)


def _start_method_failure(ctx: StageContext, group: list[dict[str, Any]], loaders: list[dict[str, Any] | None], fallback: Location | None) -> Finding:
    check, loader = group[0], loaders[0]
    pickled = check.get("pickle") or {"ok": True}
    batch = check.get("batch") or {"ok": True}
    method, used = check["method"], check.get("used") or "fork"
    methods = list(dict.fromkeys(c["method"] for c in group))
    batches = loader["batches"] if loader else 0
    works = f"it loaded {batches} batch(es) under `{used}` in the same run" if batches else f"the run used `{used}`"
    sites = list(dict.fromkeys(_where(c.get("site")) for c in group))
    broken = f"the DataLoader built at {sites[0]}" if len(sites) == 1 else f"{len(sites)} DataLoaders (built at {', '.join(sites)})"
    site = check.get("site")
    if not pickled["ok"]:
        culprit = pickled.get("culprit") or {}
        defined = culprit.get("defined_at")
        what = f"`{culprit['attribute']}` ({culprit['type']}{', defined at ' + _where(defined) if defined else ''})" if culprit else f"the {pickled['object']}"
        problem = (
            f"Under the `{'`/`'.join(methods)}` start method each worker receives the {pickled['object']} pickled, and {what} cannot be pickled: "
            f"{pickled['error']}. This breaks {broken}. Loading one batch with multiprocessing_context=\"{method}\" failed with {batch['error'][:200]}. {works[0].upper() + works[1:]}."
        )
        fix = "Replace lambdas and local functions held by the dataset (or passed as collate_fn/worker_init_fn) with module-level functions or callable classes, so the loader works under every start method."
        error_text = pickled["error"]
        location = _location(defined, None) or _location(site, fallback)
        loaders_text = "its DataLoader fails" if len(sites) == 1 else f"{len(sites)} DataLoaders fail"
        title = f"{what.split(' (')[0]} cannot be pickled: {loaders_text} under `{method}` (fine under `{used}`)"
        key = f"start-method:unpicklable:{_code(defined) or culprit.get('attribute', '')}" if culprit else f"start-method:{method}:{_code(site)}"
    else:
        problem = f"A worker started with `{method}` failed to load one batch ({batch['error'][:300]}); {works}."
        fix = "Make the dataset self-contained: state set up at run time in the main process (globals, open handles) is not there in a spawned worker; build it in __init__ or worker_init_fn."
        error_text = batch["error"]
        location = _location(site, fallback)
        title = f"DataLoader works under `{used}` but fails under `{method}`"
        key = f"start-method:{method}:{_code(site)}"
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH,
        title=title,
        location=location,
        problem=problem,
        impact=f"The training crashes at its first batch wherever workers start with `{method}`: macOS and Windows by default, Python 3.14 on Linux (forkserver), and launchers that avoid fork with CUDA.",
        fix=fix,
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{method}: {error_text.splitlines()[0][:200] if error_text else 'failed'}",
            traceback=batch.get("error") if not batch["ok"] else None,
            data={
                "start_method": method,
                "start_methods": methods,
                "used": used,
                "batches_under_used": batches,
                "pickle": pickled,
                "batch": check.get("batch"),
                "settings": (loader or {}).get("settings"),
                "loaders": [{"site": c.get("site"), "method": c["method"], "settings": (lo or {}).get("settings")} for c, lo in zip(group, loaders, strict=True)],
            },
        ),
        key=key,
    )


def _recreated_persistent(ctx: StageContext, loader: dict[str, Any], fallback: Location | None) -> Finding | None:
    settings = loader["settings"]
    if not (settings.get("persistent_workers") and settings.get("num_workers", 0) > 0 and loader["constructions"] >= 2 and loader["iterations"] >= 2):
        return None
    live = loader.get("live_workers", [])
    leak = len(live) >= 2 and live[-1] - live[0] >= settings["num_workers"]
    site = loader.get("site")
    problem = (
        f"The DataLoader at this line was constructed {loader['constructions']} times with persistent_workers=True and "
        f"num_workers={settings['num_workers']}, so its workers were started anew for every construction."
    )
    if leak:
        problem += f" The workers of earlier loaders stayed alive: live worker processes grew from {live[0]} to {live[-1]}."
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH if leak else Severity.MEDIUM,
        title="Persistent DataLoader re-created every epoch" + (" (its workers leak)" if leak else ""),
        location=_location(site, fallback),
        problem=problem,
        impact=("Worker processes and their memory accumulate until the machine runs out." if leak else "Each epoch pays the worker start-up that persistent_workers exists to avoid."),
        fix="Construct the DataLoader once, before the epoch loop, and iterate it each epoch.",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{loader['constructions']} constructions, {loader['iterations']} iterations; live workers {live[:10]}",
            data={"settings": settings, "constructions": loader["constructions"], "iterations": loader["iterations"], "live_workers": live},
        ),
        key=f"recreated-persistent:{_code(site)}",
    )


def loader_details(watch: dict[str, Any]) -> dict[str, Any]:
    return {
        "ran": True,
        "loaders": [
            {
                "site": loader.get("site"),
                "settings": loader.get("settings"),
                "constructions": loader.get("constructions"),
                "iterations": loader.get("iterations"),
                "batches": loader.get("batches"),
                "live_workers": loader.get("live_workers", [])[:10],
            }
            for loader in watch.get("loaders", [])
        ],
        "start_method_checks": [
            {
                "site": c.get("site"),
                "method": c.get("method"),
                "used": c.get("used"),
                "ok": (c.get("batch") or {"ok": True})["ok"],
                "pickled": (c.get("pickle") or {"ok": True})["ok"],
                "seconds": (c.get("batch") or {}).get("seconds"),
                "error": (c.get("pickle") or {}).get("error") or (c.get("batch") or {}).get("error"),
            }
            for c in watch.get("start_method_checks", [])
        ],
        "errors": len(watch.get("errors", [])) + len(watch.get("construction_errors", [])),
    }

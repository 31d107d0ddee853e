"""Instrument watching the target's DataLoaders: settings, failures, workers, start methods.

It records each DataLoader construction (settings and the target line that made it), the
errors its iterators raise (a worker that died, timed out or raised), the number of live
worker processes each time a loader starts iterating, and, after the entrypoint returned,
whether each multi-worker loader also works under the start methods the target did not use:
its dataset, collate_fn and worker_init_fn are pickled as a `spawn` worker would receive
them, and one batch is actually loaded by a worker started that way.
"""

from __future__ import annotations

import functools
import io
import multiprocessing
import re
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

from ...harness.sites import SiteTable

MAX_ERRORS = 20
MAX_PROBED_SITES = 3
_FRAME = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$', re.M)
_POSITIONAL = (
    "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
    "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
)
_SETTINGS = ("num_workers", "batch_size", "persistent_workers", "prefetch_factor", "pin_memory", "timeout", "multiprocessing_context", "shuffle")


def _name(obj: Any) -> str | None:
    if obj is None:
        return None
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def error_kind(message: str) -> str:
    """What a DataLoader error says about its workers."""
    if "exited unexpectedly" in message or "killed by signal" in message:
        return "worker-died"
    if "timed out after" in message:
        return "worker-timeout"
    if "in DataLoader worker process" in message:
        return "worker-exception"
    return "other"


class LoaderWatch:
    def __init__(self) -> None:
        self.sites: SiteTable | None = None
        self.by_site: dict[int, dict[str, Any]] = {}
        self.errors: list[dict[str, Any]] = []
        self.construction_errors: list[dict[str, Any]] = []
        self._probe_inputs: dict[int, dict[str, Any]] = {}
        self._loader_site: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._probe_iterators: list[Any] = []
        self._tls = threading.local()
        self.start_methods: list[str] = ["fork", "spawn"]
        self.probe_timeout_s = 60.0

    def install(self, ctx: Any) -> None:
        from torch.utils.data import dataloader

        options = ctx.options.get("concurrency", {})
        self.start_methods = list(options.get("start_methods", self.start_methods))
        self.probe_timeout_s = float(options.get("probe_timeout_s", self.probe_timeout_s))
        self.sites = SiteTable(ctx.root)
        self._wrap_loader(dataloader.DataLoader)
        self._wrap_iterator(dataloader._BaseDataLoaderIter)

    def _internal(self) -> bool:
        return bool(getattr(self._tls, "internal", False))

    # -- construction and iteration -------------------------------------------------------------
    def _wrap_loader(self, cls: Any) -> None:
        watch = self
        init, iterate = cls.__init__, cls.__iter__

        @functools.wraps(init)
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            if watch._internal():
                init(loader, *args, **kwargs)
                return
            assert watch.sites is not None
            site = watch.sites.innermost()
            try:
                init(loader, *args, **kwargs)
            except Exception as exc:
                watch._construction_failed(site, args, kwargs, exc)
                raise
            watch._constructed(loader, site)

        @functools.wraps(iterate)
        def __iter__(loader: Any) -> Any:
            iterator = iterate(loader)
            site = watch._loader_site.get(loader)
            record = watch.by_site.get(site) if site is not None else None
            if record is not None:
                record["iterations"] += 1
                try:
                    iterator._watched_loader_site = site
                except AttributeError:
                    pass
                if loader.num_workers > 0 and len(record["live_workers"]) < 50:
                    record["live_workers"].append(len(multiprocessing.active_children()))
            return iterator

        cls.__init__, cls.__iter__ = __init__, __iter__

    def _wrap_iterator(self, cls: Any) -> None:
        watch = self
        next_ = cls.__next__

        @functools.wraps(next_)
        def __next__(iterator: Any) -> Any:
            if watch._internal():
                return next_(iterator)  # a start-method probe's own batch: not the training's
            try:
                batch = next_(iterator)
            except StopIteration:
                raise
            except Exception as exc:
                watch._iteration_failed(getattr(iterator, "_watched_loader_site", None), exc)
                raise
            record = watch.by_site.get(getattr(iterator, "_watched_loader_site", -1))
            if record is not None:
                record["batches"] += 1
            return batch

        cls.__next__ = __next__

    def _constructed(self, loader: Any, site: int | None) -> None:
        if site is None:
            return
        self._loader_site[loader] = site
        settings = self._settings(loader)
        record = self.by_site.get(site)
        if record is None:
            record = self.by_site[site] = {
                "site": self.sites.site(site) if self.sites else None,
                "settings": settings,
                "constructions": 0,
                "iterations": 0,
                "batches": 0,
                "live_workers": [],
                "settings_vary": False,
            }
        elif record["settings"] != settings:
            record["settings_vary"] = True
        record["constructions"] += 1
        if loader.num_workers > 0 and site not in self._probe_inputs:
            self._probe_inputs[site] = {
                "dataset": loader.dataset,
                "collate_fn": loader.collate_fn,
                "worker_init_fn": loader.worker_init_fn,
                "batch_size": loader.batch_size if loader.batch_size is not None or loader.batch_sampler is None else 1,
                "used": settings["start_method"],
            }

    def _settings(self, loader: Any) -> dict[str, Any]:
        context = loader.multiprocessing_context
        method = context.get_start_method() if context is not None else None
        default = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
        return {
            "num_workers": loader.num_workers,
            "batch_size": loader.batch_size,
            "sampler": type(loader.sampler).__name__,
            "persistent_workers": bool(loader.persistent_workers),
            "prefetch_factor": loader.prefetch_factor,
            "pin_memory": bool(loader.pin_memory),
            "timeout": loader.timeout,
            "multiprocessing_context": method,
            "start_method": (method or default) if loader.num_workers > 0 else None,
            "generator": None if loader.generator is None else "given",
            "dataset": type(loader.dataset).__name__,
            "collate_fn": _name(loader.collate_fn),
            "worker_init_fn": _name(loader.worker_init_fn),
        }

    def _construction_failed(self, site: int | None, args: tuple[Any, ...], kwargs: dict[str, Any], exc: Exception) -> None:
        given = dict(zip(_POSITIONAL, args, strict=False))
        given.update(kwargs)
        settings = {k: given[k] if isinstance(given[k], (int, float, bool, str, type(None))) else repr(given[k])[:80] for k in _SETTINGS if k in given}
        self.construction_errors.append(
            {"site": self.sites.site(site) if self.sites else None, "settings": settings, "type": type(exc).__name__, "message": str(exc)[:1000]}
        )

    def _iteration_failed(self, site: int | None, exc: Exception) -> None:
        message = str(exc)
        key = (site, type(exc).__name__, message.splitlines()[0] if message else "")
        if len(self.errors) >= MAX_ERRORS or any(e["key"] == list(key) for e in self.errors):
            return
        self.errors.append(
            {
                "key": list(key),
                "site": self.sites.site(site) if (self.sites and site is not None) else None,
                "settings": self.by_site[site]["settings"] if site in self.by_site else None,
                "type": type(exc).__name__,
                "message": message[:3000],
                "kind": error_kind(message),
                "worker_site": self._worker_site(message),
            }
        )

    def _worker_site(self, text: str) -> dict[str, Any] | None:
        """Innermost frame of the target in a worker's traceback (outermost first)."""
        assert self.sites is not None
        for match in reversed(list(_FRAME.finditer(text))):
            path, line, function = match.group(1), int(match.group(2)), match.group(3).strip()
            if self.sites.is_target(path):
                return self.sites.site(self.sites.intern(path, line, function))
        return None

    # -- start methods, after the entrypoint returned ---------------------------------------------
    def _probe_start_methods(self) -> list[dict[str, Any]]:
        """Each multi-worker loader under each start method the run did not use.

        All probe workers are started first and read from afterwards, so their start-ups
        overlap; loaders sharing a dataset class and functions are probed once. The probe
        workers are left running: the harness exits right after and its group is killed. The
        names of the semaphores their queues share go once the checks are done
        (`_release_names`; a worker that is up holds them open): the kill would leave them in
        /dev/shm for good.
        """
        before = _semaphore_finalizers()
        try:
            return self._probe_each(self._probe_inputs)
        finally:
            after = _semaphore_finalizers()
            _release_names(after[key] for key in after.keys() - before.keys())

    def _probe_each(self, inputs_by_site: dict[Any, dict[str, Any]]) -> list[dict[str, Any]]:
        checks: list[dict[str, Any]] = []
        started: list[tuple[dict[str, Any], dict[str, Any]]] = []
        probed: dict[tuple[Any, ...], dict[str, Any]] = {}
        available = multiprocessing.get_all_start_methods()
        for site, inputs in list(inputs_by_site.items())[:MAX_PROBED_SITES]:
            for method in self.start_methods:
                if method == inputs["used"] or method not in available:
                    continue
                check: dict[str, Any] = {"site": self.sites.site(site) if self.sites else None, "method": method, "used": inputs["used"]}
                checks.append(check)
                if method != "fork":
                    check["pickle"] = self._pickle_check(inputs)
                signature = (method, type(inputs["dataset"]), id(inputs["collate_fn"]), id(inputs["worker_init_fn"]), check.get("pickle", {}).get("ok"))
                if signature in probed:
                    check["same_as"] = probed[signature]
                    continue
                probed[signature] = check
                started.append((check, self._start_probe(inputs, method)))
        for check, probe in started:
            check["batch"] = self._finish_probe(probe)
        for check in checks:
            twin = check.pop("same_as", None)
            if twin is not None:
                check["batch"] = {**twin["batch"], "same_as": twin["site"]}
        return checks

    def _pickle_check(self, inputs: dict[str, Any]) -> dict[str, Any]:
        from torch.utils.data import default_collate

        for name in ("dataset", "collate_fn", "worker_init_fn"):
            obj = inputs[name]
            if obj is None or obj is default_collate:
                continue
            try:
                _dumps(obj)
            except Exception as exc:  # noqa: BLE001 - any failure is what the worker would hit
                return {"ok": False, "object": name, "error": f"{type(exc).__name__}: {exc}"[:1000], "culprit": self._culprit(name, obj)}
        return {"ok": True}

    def _culprit(self, name: str, obj: Any) -> dict[str, Any] | None:
        """The innermost object that cannot be pickled, and where it was defined when it is
        a function: the pickler's path is walked down through attributes, containers,
        partials and bound methods, so the fix (a lambda's line) is named, not its holder."""
        assert self.sites is not None
        found = _innermost_unpicklable(obj, name)
        if found is None:
            return None
        path, culprit = found
        defined = self.sites.definition(culprit) or self.sites.definition(getattr(culprit, "__func__", None))
        return {"attribute": path, "type": type(culprit).__name__, "defined_at": defined, "qualname": getattr(culprit, "__qualname__", None)}

    def _start_probe(self, inputs: dict[str, Any], method: str) -> dict[str, Any]:
        """A one-worker loader over the same dataset, started with `method`."""
        import torch
        from torch.utils.data import DataLoader

        self._tls.internal = True
        probe: dict[str, Any] = {"started": time.perf_counter()}
        try:
            context = multiprocessing.get_context(method)
            probe["worker_started"] = context.Event()
            kwargs: dict[str, Any] = {"num_workers": 1, "multiprocessing_context": context, "timeout": self.probe_timeout_s}
            kwargs["generator"] = torch._C.Generator().manual_seed(0)  # leaves the global RNG untouched
            if inputs["collate_fn"] is not None:
                kwargs["collate_fn"] = inputs["collate_fn"]
            kwargs["worker_init_fn"] = WorkerStarted(probe["worker_started"], inputs["worker_init_fn"])
            probe["iterator"] = iter(DataLoader(inputs["dataset"], batch_size=inputs["batch_size"], **kwargs))
            self._probe_iterators.append(probe["iterator"])
        except Exception as exc:  # noqa: BLE001 - the error is the observation
            probe["error"] = exc
        finally:
            self._tls.internal = False
        return probe

    def _finish_probe(self, probe: dict[str, Any]) -> dict[str, Any]:
        error = probe.get("error")
        if error is None:
            self._tls.internal = True  # its failure is this check's result, not an error of the training
            try:
                next(probe["iterator"])
            except StopIteration:
                return {"ok": True, "empty": True, "seconds": round(time.perf_counter() - probe["started"], 3)}
            except Exception as exc:  # noqa: BLE001
                error = exc
            finally:
                self._tls.internal = False
        seconds = round(time.perf_counter() - probe["started"], 3)
        if error is None:
            return {"ok": True, "seconds": seconds}
        message = f"{type(error).__name__}: {error}"
        started = probe.get("worker_started")
        return {
            "ok": False, "error": message[:3000], "kind": error_kind(message), "worker_site": self._worker_site(message), "seconds": seconds,
            "worker_started": started.is_set() if started is not None else None,
        }

    def collect(self) -> dict[str, Any]:
        from .payloads import LoaderPayload  # at collect(): no start-up cost

        checks = self._probe_start_methods()
        return LoaderPayload.sent({
            "loaders": list(self.by_site.values()),
            "construction_errors": self.construction_errors,
            "errors": [{k: v for k, v in e.items() if k != "key"} for e in self.errors],
            "start_method_checks": checks,
        })


def _semaphore_finalizers() -> dict[Any, Any]:
    """multiprocessing's pending finalizers that unlink a named semaphore (a SemLock made for a
    start method other than fork, whose name lives in /dev/shm until unlinked), by their key."""
    from multiprocessing import synchronize, util

    cleanup = getattr(synchronize.SemLock, "_cleanup", None)
    registry = getattr(util, "_finalizer_registry", {})
    return {key: f for key, f in list(registry.items()) if cleanup is not None and getattr(f, "_callback", None) is cleanup}


def _release_names(finalizers: Iterable[Any]) -> None:
    """Unlink the named semaphores of these finalizers now: the processes that use them hold
    them open, and the name is only how a new process would open one."""
    for finalizer in finalizers:
        try:
            finalizer()
        except Exception:  # noqa: BLE001 - a name already gone
            pass


class WorkerStarted:
    """The start-method probe's worker_init_fn: it tells the probe that its worker is up (the
    interpreter started, torch imported, the dataset unpickled), then runs the loader's own.
    A probe that times out before that saw a slow start on a busy machine, not a worker that
    hangs. A class at module level: a spawned worker unpickles it by name."""

    def __init__(self, started: Any, own: Any) -> None:
        self.started, self.own = started, own

    def __call__(self, worker_id: int) -> None:
        self.started.set()
        if self.own is not None:
            self.own(worker_id)


_WALK_DEPTH = 6
_WALK_CHILDREN = 200


def _children(obj: Any, path: str) -> list[tuple[str, Any]]:
    """What pickling `obj` would pickle next, named as a reader would write it."""
    if isinstance(obj, functools.partial):
        return [(f"{path}.func", obj.func), *((f"{path}.args[{i}]", a) for i, a in enumerate(obj.args)), *((f"{path}.keywords[{k!r}]", v) for k, v in obj.keywords.items())]
    if hasattr(obj, "__self__") and hasattr(obj, "__func__"):  # a bound method pickles its instance
        return [(f"{path}.__self__", obj.__self__), (f"{path}.__func__", obj.__func__)]
    if isinstance(obj, dict):
        return [(f"{path}[{k!r}]", v) for k, v in list(obj.items())[:_WALK_CHILDREN]]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"{path}[{i}]", v) for i, v in enumerate(list(obj)[:_WALK_CHILDREN])]
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict) and not callable(obj):
        return [(f"{path}.{k}", v) for k, v in list(state.items())[:_WALK_CHILDREN]]
    return []


def _innermost_unpicklable(obj: Any, path: str, depth: int = 0) -> tuple[str, Any] | None:
    """(path, object) of the deepest part of `obj` that alone cannot be pickled; `obj`
    itself when none of its parts fails (or the walk is as deep as it goes)."""
    if depth >= _WALK_DEPTH:
        return path, obj
    for child_path, child in _children(obj, path):
        try:
            _dumps(child)
        except Exception:  # noqa: BLE001 - any failure is what the worker would hit
            return _innermost_unpicklable(child, child_path, depth + 1)
    return path, obj


def _dumps(obj: Any) -> None:
    """Pickle as a worker start would, tensors and arrays left out (their data always pickles)."""
    import torch
    from multiprocessing.reduction import ForkingPickler

    class _Probe(ForkingPickler):
        def reducer_override(self, value: Any) -> Any:
            if isinstance(value, torch.Tensor) or type(value).__name__ == "ndarray":
                return (tuple, ())
            return NotImplemented

    _Probe(io.BytesIO()).dump(obj)

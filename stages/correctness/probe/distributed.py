"""Run the entrypoint under torchrun: `nproc` ranks on this machine, each calling it as the
harness does, and one result for all of them.

The harness child got its request on stdin and holds the channel; torchrun's workers inherit
neither. So this process is the launcher: it starts the job with torchrun's own launcher API
(`torch.distributed.launcher.api.elastic_launch`, what `torchrun --standalone` runs: a c10d
rendezvous on localhost, no restarts) with `rank_main` as the workers' function and the
request, a private folder and a fresh nonce as its arguments (never in the environment or on
a command line). Each rank writes its result into that folder (mode 0700), as JSON carrying the
nonce; the launcher validates every file and hands one combined `HarnessResult` back over the
channel.

Workers are forked on the CPU and spawned on CUDA (a forked process cannot use CUDA), never in
a session of their own, so they stay in the harness's process group and die with it, as every
process the target starts must. The backend an `init_process_group` call that names none gets
is chosen by device: gloo on the CPU, NCCL on CUDA (one GPU a rank, `LOCAL_RANK`).

A watchdog thread bounds the run: past `timeout_s` it has every rank still running dump the
stacks of all its threads (faulthandler on SIGUSR1, into the rank's own file), kills the ranks,
and reports the timeout with every rank's stacks and its collective calls so far; the same
when one rank failed and the others are still running a grace period later (they wait in a
collective the failed rank never reaches).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from pydantic import ValidationError

from ...common import guard
from ...common.channel import new_nonce
from ...common.frames import innermost_target
from ...common.procstat import read_stat, send_signal
from ...contract.messages import DistributedRecord, EntrypointRequest, HarnessResult, RankResult
from ...harness.faults import call_original

# A rank that failed while others still run: how long they get to finish before the launcher
# stops them (they normally wait in a collective the failed rank never reaches).
FAILURE_GRACE_S = 3.0
# Time the ranks get to write their stack dumps after SIGUSR1.
DUMP_WAIT_S = 0.5
POLL_S = 0.1
# The collective functions of torch.distributed whose calls each rank counts, by calling line.
COLLECTIVES = (
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "barrier", "gather", "scatter", "send", "recv", "all_gather_object", "broadcast_object_list",
)
MAX_STACKS = 20000
MAX_COLLECTIVE_SITES = 200


def _rank_file(folder: Path, rank: int, kind: str) -> Path:
    return folder / f"rank-{rank}.{kind}"


# -- the launcher (the harness child) ---------------------------------------------------------


class _Reporter:
    """Hands the one result back: the first caller wins and ends the process; a second blocks
    until then (the launch returning while the watchdog reports a timeout)."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._send = send
        self._lock = threading.Lock()

    def report(self, result: dict[str, Any]) -> NoReturn:
        self._lock.acquire()  # never released: the process ends below
        self._send(result)
        guard.exit_after_reporting(0)


def launch(request: EntrypointRequest, send: Callable[[dict[str, Any]], None]) -> NoReturn:
    """Run the job, hand back the combined result with `send`, end this process."""
    spec = request.distributed
    assert spec is not None
    reporter = _Reporter(send)
    folder = Path(tempfile.mkdtemp(prefix="ranks-"))  # mode 0700: only this user reads it
    nonce = new_nonce()
    start_method = "spawn" if request.device == "cuda" else "fork"
    started = time.monotonic()
    state = _LaunchState(request, folder, nonce, start_method, started)
    watchdog = threading.Thread(target=_watch, args=(state, reporter), name="ranks-watchdog", daemon=True)
    watchdog.start()
    launcher_error: str | None = None
    failures: dict[int, int] = {}
    try:
        launcher_error = _check_devices(request)
        if launcher_error is None:
            _run_job(request, folder, nonce, start_method)
    except Exception as exc:  # noqa: BLE001 - the launcher's own failure is reported, the stage fails closed
        failures = _rank_failures(exc)
        if not failures:
            launcher_error = "".join(traceback.format_exception(exc))[-MAX_STACKS:]
    reporter.report(state.result(launcher_error=launcher_error, failures=failures))


def _check_devices(request: EntrypointRequest) -> str | None:
    assert request.distributed is not None
    if request.device != "cuda":
        return None
    import torch

    count = torch.cuda.device_count()
    if count < request.distributed.nproc:
        return f"nproc = {request.distributed.nproc} needs one GPU a rank; this machine has {count}"
    return None


def _run_job(request: EntrypointRequest, folder: Path, nonce: str, start_method: str) -> None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    assert request.distributed is not None
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=request.distributed.nproc,
        run_id=secrets.token_hex(8),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # what `torchrun --standalone` uses: a free port on this machine
        max_restarts=0,  # a restart would hide the failure being checked
        monitor_interval=POLL_S,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(folder / "logs")),
        shutdown_timeout=2,
    )
    elastic_launch(config, rank_main)(request, str(folder), nonce)


def _rank_failures(exc: BaseException) -> dict[int, int]:
    """{rank: exit status} from the launcher's ChildFailedError; {} for any other exception."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not isinstance(exc, ChildFailedError):
        return {}
    return {rank: int(failure.exitcode) for rank, failure in exc.failures.items() if failure.exitcode is not None}


def _ending(code: int) -> str:
    if code < 0:
        try:
            return f"died by {signal.Signals(-code).name} before reporting"
        except ValueError:
            return f"died by signal {-code} before reporting"
    return f"exited with status {code} before reporting"


class _LaunchState:
    def __init__(self, request: EntrypointRequest, folder: Path, nonce: str, start_method: str, started: float) -> None:
        assert request.distributed is not None
        self.request = request
        self.spec = request.distributed
        self.folder = folder
        self.nonce = nonce
        self.start_method = start_method
        self.started = started

    def pids(self) -> dict[int, int]:
        found = {}
        for rank in range(self.spec.nproc):
            try:
                found[rank] = int(_rank_file(self.folder, rank, "pid").read_text())
            except (OSError, ValueError):
                continue
        return found

    def reports(self) -> dict[int, RankResult | str]:
        """Every rank's record so far: validated, or why it cannot be trusted."""
        found: dict[int, RankResult | str] = {}
        for rank in range(self.spec.nproc):
            path = _rank_file(self.folder, rank, "json")
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                found[rank] = f"its record is not JSON: {exc}"
                continue
            if not isinstance(raw, dict) or not secrets.compare_digest(str(raw.pop("nonce", "")), self.nonce) or raw.get("rank") != rank:
                found[rank] = "its record does not carry this run's nonce and rank"
                continue
            try:
                found[rank] = RankResult.model_validate(raw)
            except ValidationError as exc:
                found[rank] = f"a malformed record: {exc.error_count()} error(s), first: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}"
        return found

    def result(self, *, launcher_error: str | None, failures: dict[int, int], timed_out: bool = False,
               stopped_after_failure: int | None = None, running: dict[int, int] | None = None, dumped: bool = False) -> dict[str, Any]:
        """The combined HarnessResult, dumped to JSON types: every rank's record in rank order;
        `dumped`: every live rank was asked for its stacks (the run was stopped)."""
        reports = self.reports()
        pids = self.pids()
        ranks: list[RankResult] = []
        for rank in range(self.spec.nproc):
            got = reports.get(rank)
            if isinstance(got, RankResult):
                # A rank that returned and waits for the others dumped its stacks too.
                ranks.append(got.model_copy(update={"stacks": _read_tail(_rank_file(self.folder, rank, "stacks"), MAX_STACKS)}) if dumped else got)
                continue
            if isinstance(got, str):
                ending = f"handed back a record the gate did not write: {got}"
            elif running is not None and rank in running:
                ending = "still running at the timeout" if timed_out else f"still running {FAILURE_GRACE_S:.0f}s after rank {stopped_after_failure} failed"
            elif rank in failures:
                ending = _ending(failures[rank])
            elif rank not in pids:
                ending = "never started"
            else:
                ending = "stopped by the launcher after another rank failed"
            ranks.append(
                RankResult(
                    rank=rank, pid=pids.get(rank), ending=ending, reported=False, exit_status=failures.get(rank) if not isinstance(got, str) else None, ok=False, phase=None, exception=None, duration_s=None,
                    stacks=_read_tail(_rank_file(self.folder, rank, "stacks"), MAX_STACKS), collectives=_read_collectives(self.folder, rank),
                )
            )
        failed = next((r for r in ranks if r.exception is not None), None)
        ok = launcher_error is None and not timed_out and all(r.ok for r in ranks)
        record = DistributedRecord(
            nproc=self.spec.nproc, backend=self.spec.backend, start_method=self.start_method, timeout_s=self.spec.timeout_s,
            timed_out=timed_out, stopped_after_failure=stopped_after_failure, launcher_error=launcher_error,
            duration_s=time.monotonic() - self.started, ranks=ranks,
        )
        shutil.rmtree(self.folder, ignore_errors=True)
        combined = HarnessResult(
            ok=ok, phase=failed.phase if failed is not None and failed.phase else "call", exception=failed.exception if failed is not None else None,
            returned=None, duration_s=record.duration_s, warnings=[], instruments={}, distributed=record,
        )
        # Every rank record whole (not `exclude_unset`, which would reach into them); the two
        # fields only a call of the entrypoint sets stay out, as before.
        return combined.model_dump(mode="json", exclude={"returned_truncated", "warnings_omitted"})


def _watch(state: _LaunchState, reporter: _Reporter) -> None:
    """Bound the run: past the timeout, or a grace period after a rank failed while others
    still run, dump every running rank's stacks, kill the ranks and report."""
    deadline = state.started + state.spec.timeout_s
    failed_at: float | None = None
    failed_rank: int | None = None
    while True:
        time.sleep(POLL_S)
        now = time.monotonic()
        if failed_at is None:
            reports = state.reports()
            failed = sorted(rank for rank, got in reports.items() if not isinstance(got, RankResult) or not got.ok)
            # A rank that died without a record (os._exit, a signal) failed too: the others may
            # wait for it inside a collective, where no Python signal handler runs, until the
            # launcher's own stop gives up 30 s later.
            failed = failed or _died_silently(state)
            if failed and len(reports) < state.spec.nproc:
                failed_at, failed_rank = now, failed[0]
        timed_out = now >= deadline
        if not timed_out and not (failed_at is not None and now - failed_at >= FAILURE_GRACE_S):
            continue
        reports = state.reports()
        alive = {rank: pid for rank, pid in state.pids().items() if _alive(pid)}
        running = {rank: pid for rank, pid in alive.items() if rank not in reports}
        if not running and not timed_out:
            # Every rank reported or died: the launch reports. A rank still alive past the grace
            # after its record (stuck in its process group's teardown, waiting on a dead peer
            # until gloo's own 30 s stop) is killed, its record kept, so the launch ends now.
            for pid in alive.values():
                send_signal(pid, signal.SIGKILL)
            continue
        # Every live rank dumps its stacks, those that returned and wait for the others too.
        for pid in alive.values():
            send_signal(pid, signal.SIGUSR1)
        time.sleep(DUMP_WAIT_S)
        for pid in alive.values():
            send_signal(pid, signal.SIGKILL)
        reporter.report(
            state.result(
                launcher_error=None, failures={}, timed_out=timed_out, stopped_after_failure=None if timed_out else failed_rank, running=running, dumped=True,
            )
        )


def _died_silently(state: _LaunchState) -> list[int]:
    """Ranks whose process is gone and left no record (the records read after the processes,
    so a rank that reported and then exited is not counted)."""
    dead = [rank for rank, pid in state.pids().items() if not _alive(pid)]
    reported = state.reports()
    return sorted(rank for rank in dead if rank not in reported)


def _alive(pid: int) -> bool:
    fields = read_stat(pid)
    return fields is not None and fields[0] != "Z"


def _read_tail(path: Path, limit: int) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-limit:]
    except OSError:
        return ""


def _read_collectives(folder: Path, rank: int) -> list[dict[str, Any]]:
    try:
        data = json.loads(_rank_file(folder, rank, "collectives").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


# -- one rank (a worker process torchrun started) --------------------------------------------


def rank_main(request: EntrypointRequest, folder: str, nonce: str) -> None:
    """Call the entrypoint as this rank and write the result for the launcher."""
    from ...harness.entrypoint import as_sent, run

    assert request.distributed is not None
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    where = Path(folder)
    guard.install_in_worker(str(_rank_file(where, rank, "stacks")))
    _write(_rank_file(where, rank, "pid"), str(os.getpid()))
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        # What torchrun does for more than one rank: one thread each, so N ranks do not
        # oversubscribe the cores (a forked rank inherits the launcher's thread pool size).
        torch.set_num_threads(1)
    if request.device == "cuda":
        torch.cuda.set_device(local_rank)
    _default_backend(request.distributed.backend)
    counter = _CollectiveCounter(Path(request.target_root).resolve(), _rank_file(where, rank, "collectives"))
    counter.install()
    result = as_sent(run(request))
    counter.stop()
    record = {
        "nonce": nonce,
        "rank": rank,
        "pid": os.getpid(),
        "ending": "returned" if result["ok"] else "raised",
        "reported": True,
        "ok": result["ok"],
        "phase": result["phase"],
        "exception": result["exception"],
        "duration_s": result["duration_s"],
        "instruments": result["instruments"],
        "stacks": "",
        "collectives": counter.snapshot(),
    }
    _write(_rank_file(where, rank, "json"), json.dumps(record, default=repr))
    guard.mark_reported()


def _write(path: Path, text: str) -> None:
    """Whole or not at all: the launcher may read while a rank writes."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _default_backend(backend: str) -> None:
    """An `init_process_group` call that names no backend gets the device's: gloo on the CPU,
    NCCL on CUDA (torch's own default would pair gloo and NCCL on a CUDA machine)."""
    import functools

    import torch.distributed as dist

    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if not args and kwargs.get("backend") is None:
            kwargs["backend"] = backend
        return call_original(original, *args, **kwargs)

    dist.init_process_group = init_process_group  # patched while the rank runs


class _CollectiveCounter:
    """Counts each rank's calls of torch.distributed's collectives by calling line, counted
    as each call begins, and keeps the counts in a file a background thread rewrites when
    they change: a rank that hangs inside a collective never returns to report them."""

    def __init__(self, root: Path, path: Path) -> None:
        self.root = root
        self.path = path
        self.counts: dict[tuple[str, str, int, str, str], int] = {}
        self._version = 0
        self._written = 0
        self._stop = threading.Event()

    def install(self) -> None:
        import functools
        import sys

        import torch.distributed as dist

        counter = self

        def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def collective(*args: Any, **kwargs: Any) -> Any:
                frames: list[tuple[str, int, str]] = []
                frame: FrameType | None = sys._getframe(1)
                while frame is not None and len(frames) < 64:
                    frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
                    frame = frame.f_back
                site = innermost_target(frames, counter.root, innermost_first=True)
                if site is not None and (len(counter.counts) < MAX_COLLECTIVE_SITES or _key(name, site) in counter.counts):
                    key = _key(name, site)
                    counter.counts[key] = counter.counts.get(key, 0) + 1
                    counter._version += 1
                return call_original(original, *args, **kwargs)

            return collective

        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if callable(original):
                setattr(dist, name, wrap(name, original))
        threading.Thread(target=self._keep_written, name="collectives", daemon=True).start()

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"function": name, "path": path, "line": line, "target_function": function, "code": code, "calls": calls}
            for (name, path, line, function, code), calls in list(self.counts.items())
        ]

    def _keep_written(self) -> None:
        while not self._stop.wait(0.2):
            if self._version != self._written:
                self._written = self._version
                _write(self.path, json.dumps(self.snapshot()))

    def stop(self) -> None:
        self._stop.set()


def _key(name: str, site: dict[str, object]) -> tuple[str, str, int, str, str]:
    return (name, str(site["path"]), int(site["line"]), str(site["function"]), str(site["code"]))  # type: ignore[call-overload]

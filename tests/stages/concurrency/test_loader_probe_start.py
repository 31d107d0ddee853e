"""The start-method probe tells a worker that never came up (a busy machine starting a fresh
interpreter slowly) from one that came up and failed: only the second is a hazard."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.paths import REPO
from traingate.stages.concurrency.loaders import _start_method_groups
from traingate.stages.concurrency.probe.payloads import StartMethodCheck

pytest.importorskip("torch")

# The probe in a process of its own, as in the harness: its spawned worker and the resource
# tracker the spawn context starts end with it (the tracker stopped and reaped before it exits).
PROBE = """
import json, sys
from pathlib import Path
from tests import spawn_datasets
from traingate.stages.concurrency.probe.loaders import LoaderWatch
from traingate.stages.harness.sites import SiteTable
watch = LoaderWatch()
watch.sites = SiteTable(Path.cwd())
watch.probe_timeout_s = float(sys.argv[2])
inputs = {"dataset": getattr(spawn_datasets, sys.argv[1])(), "batch_size": 2, "collate_fn": None, "worker_init_fn": None, "used": "fork"}
batch = watch._finish_probe(watch._start_probe(inputs, "spawn"))
for iterator in watch._probe_iterators:
    iterator._shutdown_workers()
# The resource tracker ends when this process does, but a moment later: stopped and reaped
# here, so the test's check for leftover processes never finds it on its way out.
from multiprocessing import resource_tracker
resource_tracker._resource_tracker._stop()
print(json.dumps(batch))
"""


def probe(dataset: str, timeout_s: float) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PROBE, dataset, str(timeout_s)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


# The whole start-method check, as the probe runs it at the end of a run whose loaders used
# fork: the names of the semaphores the spawn probe's queues and events made, whether each
# existed in /dev/shm when it was released, and whether it exists afterwards.
RELEASES = """
import json, os
from pathlib import Path
from tests import spawn_datasets
from traingate.stages.concurrency.probe import loaders
from traingate.stages.harness.sites import SiteTable
released = []
release = loaders._release_names

def recording(finalizers):
    finalizers = list(finalizers)
    for finalizer in finalizers:
        name = finalizer._args[0]
        released.append([name, os.path.exists("/dev/shm/sem." + name.lstrip("/"))])
    release(finalizers)

loaders._release_names = recording
watch = loaders.LoaderWatch()
watch.sites = SiteTable(Path.cwd())
watch._probe_inputs = {None: {"dataset": spawn_datasets.Numbers(), "batch_size": 2, "collate_fn": None, "worker_init_fn": None, "used": "fork"}}
[check] = watch._probe_start_methods()
after = [os.path.exists("/dev/shm/sem." + name.lstrip("/")) for name, _ in released]
for iterator in watch._probe_iterators:
    iterator._shutdown_workers()
from multiprocessing import resource_tracker
resource_tracker._resource_tracker._stop()
print(json.dumps({"ok": check["batch"]["ok"], "released": released, "after": after}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="named semaphores live in /dev/shm on Linux")
def test_the_spawn_probe_leaves_no_semaphore_name_behind() -> None:
    """The probe's workers are left running for the kill that follows the run, which no
    finalizer survives: the names their queues share go as soon as every worker has them open."""
    done = subprocess.run([sys.executable, "-c", RELEASES], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["ok"] is True and found["released"], found
    assert all(existed for _, existed in found["released"])  # the names were there to release
    assert not any(found["after"])


def test_a_probe_that_gives_up_before_its_worker_is_up_is_a_slow_start() -> None:
    # A spawned worker imports torch before its worker_init_fn runs: far longer than 0.2 s.
    batch = probe("Numbers", timeout_s=0.2)
    assert batch["ok"] is False and batch["kind"] == "worker-timeout" and batch["worker_started"] is False


def test_a_worker_that_came_up_and_failed_says_it_started() -> None:
    batch = probe("Broken", timeout_s=120)
    assert batch["ok"] is False and batch["kind"] == "worker-exception" and batch["worker_started"] is True
    assert "no such sample" in batch["error"]


def check(kind: str, started: bool | None) -> StartMethodCheck:
    return StartMethodCheck.model_validate({
        "site": None, "method": "spawn", "used": "fork", "pickle": {"ok": True},
        "batch": {"ok": False, "error": "RuntimeError: DataLoader timed out after 10 seconds", "kind": kind, "worker_site": None, "seconds": 10.0, "worker_started": started},
    })


def test_only_a_timeout_after_the_worker_started_is_a_hazard() -> None:
    assert _start_method_groups([check("worker-timeout", False)]) == []
    assert len(_start_method_groups([check("worker-timeout", True)])) == 1
    assert len(_start_method_groups([check("worker-timeout", None)])) == 1  # not known: as before
    assert len(_start_method_groups([check("worker-exception", False)])) == 1

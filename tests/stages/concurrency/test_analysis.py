"""The concurrency stage's analysis on synthetic observations: no child processes."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.supervision.isolation import ChildResult
from traingate.stages.base import EntrypointRun, StageContext
from traingate.stages.concurrency.cuda import nonblocking_observed, stream_findings
from traingate.pipeline.model.returned import comparable_leaves, same_value
from traingate.stages.concurrency.determinism import RunData, compare, deterministic_op, rng_causes, side_by_side
from traingate.stages.concurrency.loaders import loader_findings
from traingate.stages.base import entrypoint_location
from traingate.stages.concurrency.static import nonblocking_reads, set_iterations
from traingate.stages.concurrency.spec import ConcurrencyStage
from traingate.pipeline.model.registry import build_registry, parts
from traingate.stages.concurrency.probe.payloads import LoaderPayload, NonBlockingPayload, RngPayload, StreamPayload
from traingate.stages.concurrency.rules import DATALOADER_HAZARD, NONBLOCKING_RACE, STREAM_RACE


@pytest.fixture
def ctx(tmp_path: Path) -> StageContext:
    return StageContext(stage="concurrency", root=tmp_path, config=TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=tmp_path / "scratch")


def write(root: Path, name: str, source: str) -> list[str]:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path.read_text().splitlines()


def line_of(lines: list[str], marker: str) -> int:
    return next(i for i, line in enumerate(lines, start=1) if f"# {marker}" in line)


# -- reading the source ---------------------------------------------------------------------------

def test_nonblocking_scan_flags_host_copies_read_before_a_sync_only(tmp_path: Path) -> None:
    lines = write(tmp_path, "loop.py", """
        import torch

        def step(t, device):
            a = t.to("cpu", non_blocking=True)  # read-later
            print(a.shape)
            total = a.sum()
            b = t.to(torch.device("cpu"), non_blocking=True)
            torch.cuda.current_stream().synchronize()
            ok = b.numpy()
            x = t.to(device, non_blocking=True)
            y = x + 1
            v = t.to(device="cpu", non_blocking=True).item()  # read-at-once
            c = t.to("cpu", non_blocking=True)
            return c
    """)
    write(tmp_path, "tests/test_loop.py", "def test(t):\n    return t.to('cpu', non_blocking=True).item()\n")
    hits = nonblocking_reads(tmp_path)
    assert [(h.path, h.line) for h in hits] == [("loop.py", line_of(lines, "read-later")), ("loop.py", line_of(lines, "read-at-once"))]
    assert "read at line" in hits[0].detail and ".item()" in hits[1].detail


def test_set_iteration_hints_cover_loops_comprehensions_and_conversions(tmp_path: Path) -> None:
    lines = write(tmp_path, "vocab.py", """
        def build(words):
            unique = set(words)
            ids = {w: i for i, w in enumerate(unique)}  # enumerate
            for w in {x.lower() for x in words}:  # setcomp
                pass
            ordered = sorted(unique)
            return list(unique)  # list

        class Vocab:
            def __init__(self):
                self.tokens = set()

            def items(self):
                return [t for t in self.tokens]  # attribute
    """)
    hits = set_iterations(tmp_path)
    assert [h.line for h in hits] == [line_of(lines, m) for m in ("enumerate", "setcomp", "list", "attribute")]
    assert set_iterations(tmp_path, only={"other.py"}) == []


def test_entrypoint_location_is_the_def_line(tmp_path: Path) -> None:
    lines = write(tmp_path, "pkg/train.py", "import torch\n\n\ndef run(x=1):  # def\n    return x\n")
    location = entrypoint_location(tmp_path, "pkg.train:run")
    assert location is not None and (location.path, location.line, location.function) == ("pkg/train.py", line_of(lines, "def"), "run")
    assert entrypoint_location(tmp_path, "missing:run") is None


# -- determinism ------------------------------------------------------------------------------------

def run_data(label: str, losses: list[list[Any]], returned: Any = None, ok: bool = True, records: list[dict[str, Any]] | None = None, hash_seed: str = "0") -> RunData:
    child = ChildResult(argv=[], returncode=0, timed_out=False, duration_s=1.0, stdout="", stderr="")
    exception = None if ok else {"type": "RuntimeError", "message": "boom", "traceback": "", "frames": [], "target_frame": None}
    result = {"ok": ok, "phase": "call", "returned": returned, "exception": exception, "duration_s": 1.0}
    return RunData(label, hash_seed, EntrypointRun(child=child, result=result), losses, RngPayload.model_validate({"records": records or [], "target_modules": []}))


def test_exact_comparison_treats_nan_as_equal_and_ignores_timings() -> None:
    assert same_value([float("nan")], [float("nan")]) and not same_value([1.0], [1.0000001])
    kept, ignored = comparable_leaves({"loss": 1.0, "training_time_s": 3.2, "nested": {"peak_memory_mb": 1, "acc": 0.5}})
    assert kept == {"loss": 1.0, "nested.acc": 0.5}
    assert sorted(ignored) == ["nested.peak_memory_mb", "training_time_s"]
    a = run_data("a", [[1.0]], {"loss": 1.0, "elapsed": 1})
    b = run_data("b", [[1.0]], {"loss": 1.0, "elapsed": 2})
    assert compare(a, b) is None


def test_first_divergence_is_the_step_then_the_return_then_the_outcome() -> None:
    a = run_data("a", [[1.0], [0.5], [0.25]], {"loss": 0.25})
    b = run_data("b", [[1.0], [0.6], [0.2]], {"loss": 0.2})
    divergence = compare(a, b)
    assert divergence is not None and (divergence.where, divergence.step) == ("step", 1)
    rows = side_by_side(a, b, divergence)
    assert [(r.step, r.same) for r in rows] == [(1, True), (2, False), (3, False)]
    shorter = compare(a, run_data("c", [[1.0], [0.5]], {"loss": 0.25}))
    assert shorter is not None and (shorter.step, shorter.second) == (2, "no step")
    returned = compare(a, run_data("d", [[1.0], [0.5], [0.25]], {"loss": 0.3}))
    assert returned is not None and (returned.where, returned.key) == ("returned", "loss")
    outcome = compare(run_data("e", [], ok=False), run_data("f", [], {"loss": 1.0}))
    assert outcome is not None and outcome.where == "outcome"


def test_seeding_calls_that_explain_a_same_hash_divergence() -> None:
    site = {"path": "train.py", "line": 7, "function": "train", "code": "g.seed()"}
    clock = {"path": "train.py", "line": 3, "function": "train", "code": "torch.manual_seed(int(time.time()))"}
    fixed = {"path": "train.py", "line": 2, "function": "train", "code": "torch.manual_seed(0)"}
    a = run_data("a", [], records=[{"api": "torch.manual_seed", "seed": 0, "entropy": False, "site": fixed}, {"api": "torch.manual_seed", "seed": 111, "entropy": False, "site": clock}])
    b = run_data("b", [], records=[{"api": "torch.manual_seed", "seed": 0, "entropy": False, "site": fixed}, {"api": "torch.manual_seed", "seed": 112, "entropy": False, "site": clock}, {"api": "torch.Generator.seed()", "seed": 99, "entropy": True, "site": site}])
    causes = rng_causes(a, b)
    assert [(c["site"]["line"], c["why"].split(" ")[0]) for c in causes] == [(7, "seeded"), (3, "seeded")]
    assert causes[1]["seeds"] == [111, 112]
    assert rng_causes(a, a) == []


def test_deterministic_rerun_names_the_refused_op() -> None:
    child = ChildResult(argv=[], returncode=0, timed_out=False, duration_s=1.0, stdout="", stderr="")
    message = "index_add_cuda_ does not have a deterministic implementation, but you set 'torch.use_deterministic_algorithms(True)'."
    frame = {"path": "model.py", "line": 12, "function": "forward", "code": "out.index_add_(0, idx, src)"}
    exception = {"type": "RuntimeError", "message": message, "traceback": "", "frames": [], "target_frame": frame}
    run = EntrypointRun(child=child, result={"ok": False, "phase": "call", "exception": exception, "returned": None, "duration_s": 1.0})
    op = deterministic_op(run)
    assert op is not None and op["op"] == "index_add_cuda_" and op["site"] == frame
    assert deterministic_op(EntrypointRun(child=child, result={"ok": True, "phase": "call", "exception": None, "returned": None, "duration_s": 1.0})) is None


# -- DataLoaders ------------------------------------------------------------------------------------

SITE = {"path": "data.py", "line": 30, "function": "make", "code": "DataLoader(ds, num_workers=2)"}
OTHER_SITE = {"path": "data.py", "line": 41, "function": "make_val", "code": "DataLoader(val, num_workers=2)"}


SETTINGS = {
    "num_workers": 2, "batch_size": 8, "sampler": "SequentialSampler", "persistent_workers": True, "prefetch_factor": 2, "pin_memory": False,
    "timeout": 0, "multiprocessing_context": None, "start_method": "fork", "generator": None, "dataset": "Rows", "collate_fn": None, "worker_init_fn": None,
}


def loader(constructions: int, live: list[int], persistent: bool = True) -> dict[str, Any]:
    settings = {**SETTINGS, "persistent_workers": persistent}
    return {"site": SITE, "settings": settings, "constructions": constructions, "iterations": constructions, "batches": 6, "live_workers": live, "settings_vary": False}


def watch(**records: list[dict[str, Any]]) -> LoaderPayload:
    return LoaderPayload.model_validate({"loaders": [], "construction_errors": [], "errors": [], "start_method_checks": [], **records})


def test_loader_observations_become_hazards_with_their_severity(ctx: StageContext) -> None:
    worker_site = {"path": "data.py", "line": 12, "function": "__getitem__", "code": "return self.rows[i]"}
    observed = watch(
        construction_errors=[{"site": SITE, "settings": {"num_workers": 0, "prefetch_factor": 2}, "type": "ValueError", "message": "prefetch_factor option could only be specified in multiprocessing."}],
        errors=[
            {"site": SITE, "type": "RuntimeError", "message": "DataLoader worker (pid(s) 123) exited unexpectedly", "kind": "worker-died", "worker_site": None, "settings": SETTINGS},
            {"site": SITE, "type": "KeyError", "message": "Caught KeyError in DataLoader worker process 0.\nOriginal Traceback", "kind": "worker-exception", "worker_site": worker_site, "settings": SETTINGS},
            {"site": SITE, "type": "ValueError", "message": "unrelated", "kind": "other", "worker_site": None, "settings": SETTINGS},
        ],
        loaders=[loader(3, [2, 4, 6])],
        start_method_checks=[
            {"site": SITE, "method": "spawn", "used": "fork", "pickle": {"ok": True}, "batch": {"ok": True, "seconds": 2.0}},
            # the loader whose workers failed in the run: the same cause, not a second finding
            {"site": SITE, "method": "forkserver", "used": "fork", "pickle": {"ok": True}, "batch": {"ok": False, "error": "KeyError: 'vocab'", "kind": "worker-exception", "worker_site": None, "seconds": 2.0}},
            # another loader, fine in the run, failing under forkserver
            {"site": OTHER_SITE, "method": "forkserver", "used": "fork", "pickle": {"ok": True}, "batch": {"ok": False, "error": "KeyError: 'vocab'", "kind": "worker-exception", "worker_site": None, "seconds": 2.0}},
        ],
    )
    findings = loader_findings(ctx, observed, None)
    assert all(f.category is DATALOADER_HAZARD for f in findings)
    summary = sorted((f.location.line if f.location else 0, f.severity.value, f.blocking, f.title.split(" ")[0]) for f in findings)
    assert summary == [(12, "high", True, "A"), (30, "high", True, "A"), (30, "high", True, "DataLoader"), (30, "high", True, "Persistent"), (41, "high", True, "DataLoader")]
    assert [f.title for f in findings if f.location and f.location.line == 41] == ["DataLoader works under `fork` but fails under `forkserver`"]
    assert len({f.id for f in findings}) == len(findings)


def test_persistent_loader_recreated_without_leak_is_medium_and_single_construction_is_fine(ctx: StageContext) -> None:
    [finding] = loader_findings(ctx, watch(loaders=[loader(3, [2, 2, 2])]), None)
    assert finding.severity.value == "medium" and not finding.blocking
    assert loader_findings(ctx, watch(loaders=[loader(1, [2])]), None) == []
    assert loader_findings(ctx, watch(loaders=[loader(3, [2, 4, 6], persistent=False)]), None) == []


# -- CUDA observations ------------------------------------------------------------------------------

def test_observed_nonblocking_race_is_located_at_the_copy(ctx: StageContext) -> None:
    copy = {"path": "eval.py", "line": 8, "function": "evaluate", "code": "host = logits.to('cpu', non_blocking=True)"}
    read = {"path": "eval.py", "line": 9, "function": "evaluate", "code": "preds = host.argmax(-1)"}
    races = [{"copy_site": copy, "read_site": read, "read_by": "argmax"}] * 2
    [finding] = nonblocking_observed(ctx, NonBlockingPayload.model_validate({"available": True, "copies": 2, "races": races}), None)
    assert finding.category is NONBLOCKING_RACE and finding.location is not None and finding.location.line == 8
    assert finding.blocking and finding.evidence.kind.value == "observed"


def test_csan_report_printed_to_stderr_becomes_a_stream_race(ctx: StageContext) -> None:
    target = ctx.root / "side.py"
    stderr = textwrap.dedent(f"""
        ============================
        CSAN detected a possible data race on tensor with data pointer 139
        Access by stream 7 during kernel:
        aten::mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)
        writing to argument(s) out, and to the output
        With stack trace:
          File "{ctx.root.parent}/site-packages/torch/x.py", line 3, in wrapper
          File "{target}", line 21, in overlap
          File "{ctx.root.parent}/site-packages/torch/y.py", line 9, in inner

        Previous access by stream 0 during kernel:
          File "{target}", line 17, in overlap
    """)
    [finding] = stream_findings(ctx, StreamPayload.model_validate({"available": True, "reports": [], "total": 0}), stderr, None)
    assert finding.category is STREAM_RACE
    assert finding.location is not None and (finding.location.path, finding.location.line) == ("side.py", 21)
    assert finding.blocking


def test_nonblocking_watch_pending_copy_read_before_and_after_sync(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from traingate.stages.concurrency.probe.cuda import NonBlockingWatch
    from traingate.stages.harness.sites import SiteTable

    watch = NonBlockingWatch()
    watch.sites = SiteTable(Path(__file__).resolve().parent)
    host = torch.zeros(4)
    watch.copied(host)  # copy
    watch.check_read(host, ".tolist()")  # read
    assert [r["read_by"] for r in watch.races] == [".tolist()"]
    assert watch.races[0]["copy_site"]["line"] < watch.races[0]["read_site"]["line"]
    other = torch.zeros(4)
    watch.copied(other)
    watch.synchronized()
    watch.check_read(other, ".tolist()")
    assert len(watch.races) == 1


# -- the stage --------------------------------------------------------------------------------------

def test_stage_declares_only_concurrency_categories_and_is_registered() -> None:
    stage = build_registry()["concurrency"]
    assert isinstance(stage, ConcurrencyStage)
    assert {c.value for c in parts(stage).categories} == {"gradscaler-protocol", "nonblocking-race", "nondeterminism", "dataloader-hazard", "stream-race"}


def test_stage_without_entrypoint_is_skipped_with_a_reason(ctx: StageContext) -> None:
    outcome = ConcurrencyStage().run(ctx)
    assert outcome.skipped_reason is not None and "entrypoint" in outcome.skipped_reason
    assert outcome.findings == []


def test_cuda_instruments_run_their_cpu_paths_without_recording_anything(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import traceback

    from traingate.stages.concurrency.probe.cuda import NonBlockingWatch, StreamSanitizer, _mode_class
    from traingate.stages.harness.sites import SiteTable

    watch = NonBlockingWatch()
    watch.sites = SiteTable(tmp_path)
    with _mode_class(torch)(watch):
        host = torch.ones(3).to("cpu", non_blocking=True)
        torch.zeros(3).copy_(host, non_blocking=True)
        assert float(host.sum().item()) == 3.0
    assert watch.races == [] and watch.copies == 0  # nothing on CUDA, nothing pending

    sanitizer = StreamSanitizer()
    sanitizer.sites = SiteTable(Path(__file__).resolve().parent)
    here = Path(__file__).resolve()

    class Access:
        stream, operator = 7, "aten::add_"
        stack_trace = traceback.StackSummary.from_list([("/usr/lib/torch/x.py", 1, "outer", None), (str(here), 42, "overlap", None)])

    class Race(Exception):
        current_access = previous_access = Access()

    sanitizer.record(Race())
    [report] = sanitizer.reports
    assert report["site"]["line"] == 42 and report["streams"] == [7, 7]

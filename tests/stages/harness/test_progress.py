"""A watched run's progress file, and what a run killed at its budget is: still stepping, a
`budget-overrun`; steps stopped long before, or none made, a `hang`. Both block."""

from __future__ import annotations

import time
from pathlib import Path

from tests.harness_runs import run_requests
from traingate.pipeline.model.findings import stopped_finding
from traingate.pipeline.model.schema import Category
from traingate.pipeline.supervision.isolation import ChildResult
from traingate.stages.base import StageContext, read_progress
from traingate.stages.common.channel import ChannelSpec
from traingate.stages.contract.messages import EntrypointRequest
from traingate.stages.performance.probe.payloads import PERFORMANCE_FULL
from traingate.pipeline.model.config import TargetConfig

TRAIN = """
import torch


def train(steps=30):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
"""


def request(root: Path, instruments: list[str], progress: Path | None) -> str:
    return EntrypointRequest(
        target_root=str(root), call="train:train", setup=None, kwargs={}, amp_flag=None, amp=None, seed=0, device="cpu",
        instruments=instruments, instrument_options={}, deterministic=False, channel=ChannelSpec(fd=-1, nonce="unused"),
        progress_file=str(progress) if progress is not None else None,
    ).model_dump_json()


def test_a_run_given_a_progress_file_writes_its_steps_and_one_given_none_nothing(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    watched, timed = tmp_path / "watched.progress", tmp_path / "timed.progress"
    requests = [(request(tmp_path, [PERFORMANCE_FULL], watched), str(tmp_path / "w.json")), (request(tmp_path, [], timed), str(tmp_path / "t.json"))]
    run_requests(tmp_path, [*requests, (request(tmp_path, [], None), str(tmp_path / "u.json"))])
    for path in (watched, timed):  # an instrumented run, and a timing run with no instrument
        steps, idle = read_progress(path, time.time()) or (0, 0.0)
        assert steps >= 1 and idle < 60  # throttled: the first step's write, then one per quarter second
    assert sorted(p.name for p in tmp_path.glob("*.progress")) == ["timed.progress", "watched.progress"]  # the unwatched run: none


def ctx(root: Path) -> StageContext:
    return StageContext(stage="correctness", root=root, config=TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=root / "scratch")


def killed(duration_s: float) -> ChildResult:
    return ChildResult(argv=["python"], returncode=-9, timed_out=True, duration_s=duration_s, stdout="", stderr="")


def test_a_run_still_stepping_at_its_budget_is_an_overrun_and_one_that_stopped_a_hang(tmp_path: Path) -> None:
    overrun = stopped_finding(ctx(tmp_path), killed(60.0), "The correctness stage's instrumented run", run="instrumented", progress=(1200, 0.2))
    assert (overrun.category, overrun.blocking) == (Category.BUDGET_OVERRUN, True)
    assert "made 1200 optimizer step(s)" in overrun.problem and "max_steps" in overrun.fix
    for progress in ((1200, 40.0), None):  # its steps stopped 40 s before the end; no step at all
        stuck = stopped_finding(ctx(tmp_path), killed(60.0), "The correctness stage's instrumented run", run="instrumented", progress=progress)
        assert (stuck.category, stuck.blocking) == (Category.HANG, True)


def test_a_progress_file_that_is_not_the_harnesses_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "run.progress"
    for text in ("", "many steps", "12", "12 soon later"):
        path.write_text(text)
        assert read_progress(path, time.time()) is None
    assert read_progress(tmp_path / "absent.progress", time.time()) is None

"""The instrumented run's cost on heavy autograd graphs: the per-operator instruments stop
once the window the leak and sync verdicts need is covered, and the verdicts use that window.

Each test runs the full instrument in a child process through the stages' own harness.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from traingate.stages.performance.probe.payloads import PERFORMANCE_FULL
from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.stages.base import StageContext, run_entrypoint
from traingate.stages.performance.probe.payloads import FullPayload
from traingate.stages.performance.probe.frame_index import MAX_WALK_NODES
from traingate.stages.performance.probe.instrument import HEAVY_OPS_PER_STEP, STEADY_WINDOW_STEPS, WINDOW_STEPS
from traingate.stages.performance.stage import analyse

WARMUP, MIN_STEPS, STEPS = 3, 8, 26
WINDOW_END = WARMUP + max(MIN_STEPS, WINDOW_STEPS)
STEADY_END = WARMUP + max(MIN_STEPS, STEADY_WINDOW_STEPS)

# A chain of tiny elementwise operators (about 11 per link forward and backward), a loss read
# with `.item()` every step (a host sync on CUDA) and, optionally, a list that keeps 4 KiB
# per step (a leak).
LOOP = '''
import torch
from torch import nn


class Chain(nn.Module):
    def __init__(self, links: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.randn(4) * 0.1)
        self.links = links

    def forward(self, x):
        for _ in range(self.links):
            x = torch.tanh(x * self.weights + 0.1)
        return x


def train(steps: int, links: int, leak: bool = False, leak_from: int = 0, log_every: int = 1) -> float:
    torch.manual_seed(0)
    model = Chain(links)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    total = 0.0
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(2, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        if step % log_every == 0:
            total += loss.item()
        if leak and step >= leak_from:
            kept.append(torch.zeros(1024))
    return total
'''


def _context(root: Path, scratch: Path, call: str = "loop:train", kwargs: dict[str, Any] | None = None, warm: WarmPool | None = None) -> StageContext:
    config = TargetConfig.model_validate({"entrypoint": {"call": call, "kwargs": kwargs or {}}, "performance": {"warmup_steps": WARMUP, "min_steps": MIN_STEPS}})
    return StageContext(stage="performance", root=root, config=config, device="cpu", deadline=time.time() + 600, scratch=scratch, warm=warm)


def _profile(tmp_path: Path, warm: WarmPool | None, links: int, leak: bool, **loop: int) -> tuple[StageContext, dict[str, Any]]:
    target = tmp_path / "target"
    target.mkdir(exist_ok=True)
    (target / "loop.py").write_text(LOOP)
    ctx = _context(target, tmp_path / f"scratch-{links}-{leak}", kwargs={"steps": STEPS, "links": links, "leak": leak, **loop}, warm=warm)
    run = run_entrypoint(
        ctx, label="profile", instruments=[PERFORMANCE_FULL],
        options={"warmup_steps": WARMUP, "min_steps": MIN_STEPS}, env=ctx.child_env(OMP_NUM_THREADS="1"),
    )
    assert run.ok, run.failure()
    return ctx, run.instrument(PERFORMANCE_FULL)


@pytest.fixture(scope="module")
def late_leak(tmp_path_factory: pytest.TempPathFactory, warm_pool: WarmPool | None) -> tuple[StageContext, dict[str, Any]]:
    """A heavy loop (about 1.1x the threshold in operators per step, the same count every run)
    with a list that starts keeping 4 KiB per step a few steps after warm-up: one run read by
    the two tests below."""
    return _profile(tmp_path_factory.mktemp("late-leak"), warm_pool, HEAVY_OPS_PER_STEP // 10, leak=True, leak_from=WARMUP + 2)


def test_a_heavy_loop_is_instrumented_over_the_verdicts_window_only(late_leak: tuple[StageContext, dict[str, Any]]) -> None:
    ctx, profile = late_leak
    window = profile["instrumentation"]
    assert window["ops_per_step"] > HEAVY_OPS_PER_STEP
    assert window["window_end"] == WINDOW_END
    assert window["instrumented_steps"] == WINDOW_END
    assert window["ended_steady"] is False  # held memory grows: the whole window is needed
    # The step clock runs on: every step is timed, the per-operator measures end with the window.
    assert profile["clock"]["steps"] == STEPS
    assert len(profile["clock"]["host"]["step"]) == STEPS
    assert len(profile["memory"]["held_bytes"]) == WINDOW_END
    assert profile["syncs"]["steps_counted"] == WINDOW_END
    counted = {int(step) for record in profile["syncs"]["records"] for step in record["per_step"]}
    assert counted and max(counted) < WINDOW_END

    outcome = analyse(ctx, FullPayload.model_validate(profile), {}, [], None)
    categories = {f.category.value for f in outcome.findings}
    assert "memory-leak" in categories  # found within the window: 4 KiB per step
    sync = next(f for f in outcome.findings if f.category.value == "host-sync")
    assert sync.location is not None and sync.location.path == "loop.py"
    data = sync.evidence.data
    # The rate is per instrumented step: one `.item()` per step, not 19 syncs over 26 steps.
    assert data["steps_observed"] == WINDOW_END
    assert data["per_step"] == 1.0
    assert outcome.details["steps"]["instrumented"] == WINDOW_END
    profiled = next(m for m in outcome.metrics if m.id == "steps.profiled")
    assert profiled.value == STEPS and f"first {WINDOW_END} steps" in (profiled.note or "")


def test_a_light_loop_is_instrumented_at_every_step(tmp_path: Path, warm_pool: WarmPool | None) -> None:
    ctx, profile = _profile(tmp_path, warm_pool, links=20, leak=False)
    window = profile["instrumentation"]
    assert window["ops_per_step"] < HEAVY_OPS_PER_STEP
    assert window["window_end"] is None
    assert window["instrumented_steps"] == STEPS
    assert len(profile["memory"]["held_bytes"]) == STEPS
    assert profile["syncs"]["steps_counted"] is None
    outcome = analyse(ctx, FullPayload.model_validate(profile), {}, [], None)
    assert "memory-leak" not in {f.category.value for f in outcome.findings}
    sync = next(f for f in outcome.findings if f.category.value == "host-sync")
    assert sync.evidence.data["steps_observed"] == STEPS
    assert outcome.details["steps"]["instrumented"] == STEPS


def test_a_steady_heavy_loop_ends_its_window_after_the_shortest_one(tmp_path: Path, warm_pool: WarmPool | None) -> None:
    """Nothing retained, held memory flat, one `.item()` per step: the per-operator
    instruments stop after max(min_steps, STEADY_WINDOW_STEPS) steps past warm-up, and the
    verdicts and notes say over how many steps they were measured and why."""
    ctx, profile = _profile(tmp_path, warm_pool, HEAVY_OPS_PER_STEP // 10, leak=False)
    window = profile["instrumentation"]
    assert window["ops_per_step"] > HEAVY_OPS_PER_STEP
    assert window["window_planned"] == WINDOW_END
    assert window["ended_steady"] is True
    assert window["window_end"] == window["instrumented_steps"] == STEADY_END < WINDOW_END
    assert profile["clock"]["steps"] == STEPS
    assert len(profile["memory"]["held_bytes"]) == STEADY_END
    assert profile["syncs"]["steps_counted"] == STEADY_END
    # One step's graph (a few thousand nodes) is under the walk cap: counted, not a lower bound.
    assert 0 < profile["memory"]["step_graph_nodes"] < MAX_WALK_NODES
    assert window["graph_walk_capped"] is False

    outcome = analyse(ctx, FullPayload.model_validate(profile), {}, [], None)
    assert "memory-leak" not in {f.category.value for f in outcome.findings}
    held = next(m for m in outcome.metrics if m.id == "memory.held_growth")
    assert held.passed is True  # decided over min_steps points, not left undecided
    sync = next(f for f in outcome.findings if f.category.value == "host-sync")
    assert sync.evidence.data["steps_observed"] == STEADY_END
    assert sync.evidence.data["per_step"] == 1.0
    profiled = next(m for m in outcome.metrics if m.id == "steps.profiled")
    assert f"first {STEADY_END} steps" in (profiled.note or "") and "did not change" in (profiled.note or "")


def test_a_heavy_loop_whose_syncs_vary_keeps_the_whole_window(tmp_path: Path, warm_pool: WarmPool | None) -> None:
    """`.item()` every other step: the per-step sync pattern is not steady, so the window is
    not cut short (a rate over a few steps could miss a sync made every k-th step)."""
    _, profile = _profile(tmp_path, warm_pool, HEAVY_OPS_PER_STEP // 10, leak=False, log_every=2)
    window = profile["instrumentation"]
    assert window["ended_steady"] is False
    assert window["instrumented_steps"] == WINDOW_END


def test_a_leak_that_starts_after_warm_up_keeps_the_whole_window(late_leak: tuple[StageContext, dict[str, Any]]) -> None:
    """A list that starts keeping 4 KiB per step a few steps after warm-up: the held memory
    moves within the shortest window, so the window runs to its end and the leak is found."""
    ctx, profile = late_leak
    window = profile["instrumentation"]
    assert window["ended_steady"] is False
    assert window["instrumented_steps"] == WINDOW_END
    outcome = analyse(ctx, FullPayload.model_validate(profile), {}, [], None)
    assert "memory-leak" in {f.category.value for f in outcome.findings}

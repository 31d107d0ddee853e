"""The instrumented run's cost on heavy autograd graphs: the per-operator instruments stop
once the window the leak and sync verdicts need is covered, and the verdicts use that window.

Each test runs the full instrument in a child process through the stages' own harness.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from traingate.pipeline.config import TargetConfig
from traingate.stages.base import StageContext, run_entrypoint
from traingate.stages.contract import instruments
from traingate.stages.performance.probe.instrument import HEAVY_OPS_PER_STEP, WINDOW_STEPS
from traingate.stages.performance.stage import analyse

WARMUP, MIN_STEPS, STEPS = 3, 8, 26
WINDOW_END = WARMUP + max(MIN_STEPS, WINDOW_STEPS)

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


def train(steps: int, links: int, leak: bool = False) -> float:
    torch.manual_seed(0)
    model = Chain(links)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    total = 0.0
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(2, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        total += loss.item()
        if leak:
            kept.append(torch.zeros(1024))
    return total
'''


def _context(root: Path, scratch: Path, call: str = "loop:train", kwargs: dict[str, Any] | None = None) -> StageContext:
    config = TargetConfig.model_validate({"entrypoint": {"call": call, "kwargs": kwargs or {}}, "performance": {"warmup_steps": WARMUP, "min_steps": MIN_STEPS}})
    return StageContext(stage="performance", root=root, config=config, device="cpu", deadline=time.time() + 600, scratch=scratch)


def _profile(tmp_path: Path, links: int, leak: bool) -> tuple[StageContext, dict[str, Any]]:
    target = tmp_path / "target"
    target.mkdir(exist_ok=True)
    (target / "loop.py").write_text(LOOP)
    ctx = _context(target, tmp_path / f"scratch-{links}-{leak}", kwargs={"steps": STEPS, "links": links, "leak": leak})
    run = run_entrypoint(
        ctx, label="profile", instruments=[instruments.PERFORMANCE_FULL],
        options={"warmup_steps": WARMUP, "min_steps": MIN_STEPS}, env=ctx.child_env(OMP_NUM_THREADS="1"),
    )
    assert run.ok, run.failure()
    return ctx, run.instrument(instruments.PERFORMANCE_FULL)


def test_a_heavy_loop_is_instrumented_over_the_verdicts_window_only(tmp_path: Path) -> None:
    links = HEAVY_OPS_PER_STEP // 8  # about 1.4x the threshold in operators per step
    ctx, profile = _profile(tmp_path, links, leak=True)
    window = profile["instrumentation"]
    assert window["ops_per_step"] > HEAVY_OPS_PER_STEP
    assert window["window_end"] == WINDOW_END
    assert window["instrumented_steps"] == WINDOW_END
    # The step clock runs on: every step is timed, the per-operator measures end with the window.
    assert profile["clock"]["steps"] == STEPS
    assert len(profile["clock"]["host"]["step"]) == STEPS
    assert len(profile["memory"]["held_bytes"]) == WINDOW_END
    assert profile["syncs"]["steps_counted"] == WINDOW_END
    counted = {int(step) for record in profile["syncs"]["records"] for step in record["per_step"]}
    assert counted and max(counted) < WINDOW_END

    outcome = analyse(ctx, profile, {}, [], None)
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


def test_a_light_loop_is_instrumented_at_every_step(tmp_path: Path) -> None:
    ctx, profile = _profile(tmp_path, links=20, leak=False)
    window = profile["instrumentation"]
    assert window["ops_per_step"] < HEAVY_OPS_PER_STEP
    assert window["window_end"] is None
    assert window["instrumented_steps"] == STEPS
    assert len(profile["memory"]["held_bytes"]) == STEPS
    assert profile["syncs"]["steps_counted"] is None
    outcome = analyse(ctx, profile, {}, [], None)
    assert "memory-leak" not in {f.category.value for f in outcome.findings}
    sync = next(f for f in outcome.findings if f.category.value == "host-sync")
    assert sync.evidence.data["steps_observed"] == STEPS
    assert outcome.details["steps"]["instrumented"] == STEPS

"""Hand-made performance measurements, baselines and stage contexts, as the probes and a
`--baseline` report hand them to the stage's decisions (no processes)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.model.schema import PipelineReport
from traingate.stages.base import StageContext
from traingate.stages.performance import regression as perf_regression
from traingate.stages.performance.details import MachineRecord
from traingate.stages.performance.probe.payloads import AmpCounts, FullPayload, MemoryRecord, StepClockRecord


def make_ctx(tmp_path: Path, baseline: dict[str, Any] | None = None, **config: Any) -> StageContext:
    return StageContext(
        stage="performance", root=tmp_path, config=TargetConfig.model_validate(config), device="cpu",
        deadline=time.time() + 60, scratch=tmp_path, baseline=as_report(baseline) if baseline is not None else None,
    )


def as_report(baseline: dict[str, Any]) -> PipelineReport:
    """A report.json holding the given version, device and stages (name and metrics), as --baseline reads it."""
    environment = {"python": "3.11", "torch": None, "device_name": "cpu", **baseline["environment"]}
    stages = [{"status": "passed", "score": 100, "duration_s": 1.0, "summary": "", **stage} for stage in baseline["stages"]]
    return PipelineReport.model_validate({
        "tool_version": "0", "task": "t", "version": baseline["version"], "target": {"path": "."}, "started_at": "", "duration_s": 1.0,
        "decision": "PASS", "score": 100, "environment": environment, "stages": stages,
    })


def clock(step_ms: list[float], data_ms: list[float] | None = None, losses: list[float] | None = None, loaders: list[Any] | None = None) -> StepClockRecord:
    steps = [t / 1e3 for t in step_ms]
    data = [t / 1e3 for t in (data_ms or [0.0] * len(step_ms))]
    host = {"step": steps, "data": data, "forward": [s * 0.3 for s in steps], "backward": [s * 0.5 for s in steps], "optimizer": [0.0] * len(steps), "rest": [0.0] * len(steps)}
    return StepClockRecord.model_validate({
        "steps": len(steps), "backward_calls": len(steps), "training_forwards": len(steps), "training_device": "cpu", "host": host, "device": None,
        "losses": losses or [1.0] * len(steps), "loaders": loaders or [], "forward_sites": [], "peak_memory_bytes": None, "truncated": False,
    })


def memory_record(memory: dict[str, Any]) -> MemoryRecord:
    """A hand-made memory series as the probe's record: what the test leaves out is what a
    run without retained tensors reports."""
    return MemoryRecord.model_validate({
        "source": "live tensor storages (dispatch-mode registry)", "peak_tracked_bytes": max(memory.get("held_bytes") or [0]), "storages_registered": 100,
        "checks": [], "step_graph_nodes": 10, "growth_lines": [], "retained_at_end": [], **memory,
    })


def full_payload(profile: dict[str, Any]) -> FullPayload:
    """A hand-made instrumented run's payload; the window covers every step, as on a light loop."""
    steps = profile["clock"].steps
    window = {"ops_per_step": 200, "heavy_ops_per_step": 50_000, "window_end": None, "window_planned": None, "ended_steady": False, "instrumented_steps": steps, "graph_walk_capped": False, "graph_walk_cap": 10_000}
    syncs = {"in_data_loading": 0, "steps_counted": None, "sync_debug_mode": None, **profile["syncs"]}
    return FullPayload.model_validate({**profile, "memory": memory_record(profile["memory"]), "syncs": syncs, "instrument_s": 0.01, "instrumentation": window})


# The machine of the hand-made baselines below, and a quiet timing run on it: a stored step
# time compares only with one measured on the same machine, both quiet (regression.py).
MACHINE = {"cpu_model": "Test CPU @ 2.0GHz", "cpus": 16, "device": "cpu", "device_name": None, "torch": "2.13.0"}
QUIET_RUN = {"label": "timing (default)", "amp": None, "steps": 40, "duration_s": 2.0, "load": {"wall_s": 2.0, "other_cpu_share": 0.02, "own_cpu_s": 2.0, "loadavg": 0.3, "quiet": True}}


def baseline_with(metrics: list[dict[str, Any]], device: str = "cpu", machine: dict[str, Any] | None = MACHINE) -> dict[str, Any]:
    details = {"machine": machine, "runs": [QUIET_RUN]} if machine else {}
    return {"version": "v1", "environment": {"device": device}, "stages": [{"name": "performance", "metrics": metrics, "details": details}]}


def quiet_timings(**machine: Any) -> perf_regression.Timings:
    """This run's timings taken quietly on MACHINE (with `machine`'s fields changed)."""
    return perf_regression.Timings(MachineRecord.model_validate({**MACHINE, **machine}), True, "other processes took up to 2% of its CPU time")


def noisy(centre_ms: float, steps: int, spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [centre_ms * (1 + rng.uniform(-spread, spread)) for _ in range(steps)]


ACTIVE = AmpCounts.model_validate({"matmul_dtypes_in_steps": {"bfloat16": 40}, "matmul_dtypes_outside_steps": {}, "reduced_in_steps": 40, "autocast": []})
INACTIVE = AmpCounts.model_validate({"matmul_dtypes_in_steps": {"float32": 40}, "matmul_dtypes_outside_steps": {}, "reduced_in_steps": 0, "autocast": []})

"""One run of the entrypoint under torchrun (`traingate.stages.correctness.probe.distributed`): the
request carries the rank count, the timeout and the device's backend; the result comes back
over the channel as one `HarnessResult` holding every rank's."""

from __future__ import annotations

from typing import Literal

from traingate.stages.base import EntrypointRun, StageContext, run_entrypoint
from traingate.stages.contract.messages import DistributedSpec
from traingate.stages.correctness.probe.payloads import CORRECTNESS_LAUNCHER

# Seconds the harness needs past the ranks' timeout to dump their stacks, kill them and report.
REPORT_ALLOWANCE_S = 5.0


def backend_for(device: str) -> Literal["gloo", "nccl"]:
    """gloo on the CPU, NCCL on CUDA: the backend each device's collectives need."""
    return "nccl" if device == "cuda" else "gloo"


def run_distributed(ctx: StageContext, *, label: str, nproc: int, timeout_s: float, instruments: list[str], amp: bool | None = None) -> EntrypointRun:
    """Run the configured entrypoint with `nproc` ranks; the child's own budget is the ranks'
    timeout plus the time to report, so the child's kill is only a backstop."""
    spec = DistributedSpec(nproc=nproc, timeout_s=timeout_s, backend=backend_for(ctx.device), launcher=CORRECTNESS_LAUNCHER)
    return run_entrypoint(ctx, label=label, amp=amp, instruments=instruments, budget_s=timeout_s + REPORT_ALLOWANCE_S, distributed=spec)

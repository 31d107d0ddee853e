"""One run of the entrypoint under torchrun (`traingate.stages.harness.distributed`): the
request carries the rank count, the timeout and the device's backend; the result comes back
over the channel as one `HarnessResult` holding every rank's."""

from __future__ import annotations

import json
from typing import Any, Literal

from traingate.pipeline.isolation import python_argv, run_child
from traingate.stages.base import EntrypointRun, StageContext, read_harness_result
from traingate.stages.contract.channel import ChannelSpec, new_nonce
from traingate.stages.contract.messages import DistributedSpec, EntrypointRequest

# Seconds the harness needs past the ranks' timeout to dump their stacks, kill them and report.
REPORT_ALLOWANCE_S = 5.0


def backend_for(device: str) -> Literal["gloo", "nccl"]:
    """gloo on the CPU, NCCL on CUDA: the backend each device's collectives need."""
    return "nccl" if device == "cuda" else "gloo"


def run_distributed(ctx: StageContext, *, label: str, nproc: int, timeout_s: float, instruments: list[str], amp: bool | None = None) -> EntrypointRun:
    """Run the configured entrypoint with `nproc` ranks; the child's own budget is the ranks'
    timeout plus the time to report, so the child's kill is only a backstop."""
    ep = ctx.config.entrypoint
    if ep is None:
        raise ValueError("no entrypoint configured")
    name = ctx.next_name(label)
    nonce = new_nonce()
    spec = DistributedSpec(nproc=nproc, timeout_s=timeout_s, backend=backend_for(ctx.device))
    fields: dict[str, Any] = {
        "target_root": str(ctx.root),
        "call": ep.call,
        "script": ep.script,
        "args": ep.script_argv(amp),
        "setup": ep.setup,
        "kwargs": dict(ep.kwargs),
        "amp_flag": ep.amp_flag,
        "amp": amp,
        "seed": ep.seed,
        "device": ctx.device,
        "instruments": instruments,
        "instrument_options": {},
        "deterministic": False,
        "distributed": spec.model_dump(mode="json"),
    }

    def request(fd: int) -> bytes:
        return EntrypointRequest(**fields, channel=ChannelSpec(fd=fd, nonce=nonce)).model_dump_json().encode()

    ctx.scratch.mkdir(parents=True, exist_ok=True)
    (ctx.scratch / f"{name}.request.json").write_text(json.dumps(fields, default=repr, indent=1))
    child = run_child(
        python_argv("traingate.stages.harness.entrypoint"),
        cwd=ctx.root,
        budget_s=min(timeout_s + REPORT_ALLOWANCE_S, ctx.child_budget()),
        scratch=ctx.scratch,
        env=ctx.child_env(),
        name=name,
        stdin_data=request,
        channel=True,
    )
    ctx.entrypoint_runs.append((label, child))
    record, problem = read_harness_result(child, nonce)
    return EntrypointRun(child=child, result=record.model_dump(mode="json") if record is not None else None, channel_problem=problem)

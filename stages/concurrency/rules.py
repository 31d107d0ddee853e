"""The concurrency stage's rules: the GradScaler protocol, non_blocking copies, nondeterminism, DataLoader workers, CUDA streams.

Ids, severities and texts are the report's contract (docs/categories.md is generated from them).
"""

from __future__ import annotations

from traingate.stages.api import Blocks, Category, Rule, Severity

STAGE = "concurrency"

# The stage's categories (`traingate explain CATEGORY`); a finding's category is one of these objects.
GRADSCALER_PROTOCOL = Category("gradscaler-protocol")
NONBLOCKING_RACE = Category("nonblocking-race")
NONDETERMINISM = Category("nondeterminism")
DATALOADER_HAZARD = Category("dataloader-hazard")
STREAM_RACE = Category("stream-race")

RULES: tuple[Rule, ...] = (
    Rule(
        category=GRADSCALER_PROTOCOL, stage=STAGE, severity=Severity.HIGH,
        description="GradScaler used out of protocol (clip before `unscale_`, `optimizer.step` bypassing the scaler, missing `update`, double `unscale_`)",
        check="Runs the entrypoint with GradScaler and optimizer calls recorded, per iteration.",
        measure="The observed call sequence of each iteration, checked against the scale/unscale_/step/update protocol.",
        blocks=Blocks.POLICY,
        impact="Gradients are clipped or applied at the wrong scale, or the scale never adapts: training silently diverges or skips steps.",
        fix="Follow the order scaler.scale(loss).backward(), scaler.unscale_(optimizer) before clipping, scaler.step(optimizer), scaler.update().",
    ),
    # The protocol's own rules: each GradScaler finding is built from one of these.
    Rule(
        category=GRADSCALER_PROTOCOL, stage=STAGE, severity=Severity.HIGH,
        description='Gradients clipped while still scaled (clipping before scaler.unscale_)',
        check='The gradients were clipped after a backward of a scaled loss and before `scaler.unscale_(optimizer)`, so the clipping threshold was compared with gradients multiplied by the loss scale.',
        measure="The recorded GradScaler and optimizer calls of each iteration, in order.",
        blocks=Blocks.POLICY,
        impact='With scaling on (65536 by default) almost every step is clipped to the threshold, silently shrinking the updates; the model trains much slower or not at all under AMP.',
        fix='Call `scaler.unscale_(optimizer)` right before clipping: `scaler.scale(loss).backward(); scaler.unscale_(optimizer); clip_grad_norm_(...); scaler.step(optimizer); scaler.update()`.',
        sub='clip-before-unscale',
    ),
    Rule(
        category=GRADSCALER_PROTOCOL, stage=STAGE, severity=Severity.HIGH,
        description='optimizer.step() called directly while a GradScaler scales the loss',
        check='The optimizer stepped on gradients of a scaled loss without going through `scaler.step(optimizer)`.',
        measure="The recorded GradScaler and optimizer calls of each iteration, in order.",
        blocks=Blocks.POLICY,
        impact='The update uses gradients multiplied by the loss scale and is never skipped on inf/NaN gradients, so one overflow corrupts the weights; `scaler.update()` then raises or misadjusts the scale.',
        fix='Replace `optimizer.step()` with `scaler.step(optimizer)` followed by `scaler.update()`.',
        sub='step-bypasses-scaler',
    ),
    Rule(
        category=GRADSCALER_PROTOCOL, stage=STAGE, severity=Severity.HIGH,
        description='scaler.step() without scaler.update() before the next iteration',
        check='`scaler.step(optimizer)` ran and the next iteration began (another `scale` or `step`) without `scaler.update()` in between.',
        measure="The recorded GradScaler and optimizer calls of each iteration, in order.",
        blocks=Blocks.POLICY,
        impact='The loss scale never adapts: after an overflow every later step is skipped, and with scaling enabled the next `scaler.step` raises `step() has already been called since the last update()`.',
        fix='Call `scaler.update()` once per iteration, after `scaler.step(...)` for every optimizer.',
        sub='missing-update',
    ),
    Rule(
        category=GRADSCALER_PROTOCOL, stage=STAGE, severity=Severity.HIGH,
        description='scaler.unscale_() called twice before a step',
        check='`scaler.unscale_(optimizer)` ran a second time for the same optimizer before `scaler.step`/`scaler.update`.',
        measure="The recorded GradScaler and optimizer calls of each iteration, in order.",
        blocks=Blocks.POLICY,
        impact='With scaling enabled this raises `unscale_() has already been called on this optimizer since the last update()`; if it did not, gradients would be divided by the scale twice.',
        fix='Call `scaler.unscale_(optimizer)` once per optimizer per iteration, after all gradients for that step have been accumulated.',
        sub='unscale-twice',
    ),
    Rule(
        category=GRADSCALER_PROTOCOL, stage=STAGE, severity=Severity.HIGH,
        description='scaler.unscale_() called after scaler.step() in the same iteration',
        check='`scaler.unscale_(optimizer)` ran after `scaler.step(optimizer)` and before `scaler.update()`.',
        measure="The recorded GradScaler and optimizer calls of each iteration, in order.",
        blocks=Blocks.POLICY,
        impact='With scaling enabled this raises `unscale_() is being called after step()`; whatever it prepares comes too late to affect the update.',
        fix='Move `scaler.unscale_(optimizer)` (and any clipping) before `scaler.step(optimizer)`.',
        sub='unscale-after-step',
    ),
    Rule(
        category=GRADSCALER_PROTOCOL, stage=STAGE, severity=Severity.HIGH,
        description='Optimizer step on gradients of an earlier iteration',
        check="The optimizer stepped although no backward ran since its previous step and its gradients were not cleared, so it applied the previous iteration's gradients again.",
        measure="The recorded GradScaler and optimizer calls of each iteration, in order.",
        blocks=Blocks.POLICY,
        impact='Each such step repeats an old update: the training silently takes extra steps in a stale direction.',
        fix="Run the backward of the current batch before each step (and `zero_grad()` after it); under gradient accumulation step only after the last micro-batch's backward.",
        sub='stale-gradients',
    ),
    Rule(
        category=NONBLOCKING_RACE, stage=STAGE, severity=Severity.HIGH,
        description="the result of a `non_blocking` copy is read before the copy is known to be complete",
        check="Records device-to-host copies made with non_blocking=True and the first read of their result.",
        measure="Observed on CUDA: a read with no synchronisation in between; elsewhere read from source (static, never blocks).",
        blocks=Blocks.POLICY,
        impact="Reads stale or partial values at random: losses, metrics or saved tensors that differ from what the GPU computed.",
        fix="Synchronise before reading the copy (`torch.cuda.current_stream().synchronize()`, or record an event after the "
        "copy and call `event.synchronize()`), or drop non_blocking=True for copies that are read right away.",
    ),
    Rule(
        category=NONDETERMINISM, stage=STAGE, severity=Severity.HIGH,
        description="two runs with the same seeds diverge",
        check="Runs the entrypoint again with the same seeds (and another hash seed, and deterministic algorithms) and compares.",
        measure="The per-step losses, returned values and seeding calls of the runs; the first difference is located.",
        blocks=Blocks.POLICY,
        impact="Results cannot be reproduced or compared between runs: a regression and a lucky seed look the same, and a bug seen once may never show again.",
        fix="Seed every source of randomness the run uses (torch, numpy, random, DataLoader workers) and avoid iteration over sets or other hash-ordered containers.",
    ),
    Rule(
        category=DATALOADER_HAZARD, stage=STAGE, severity=Severity.HIGH,
        description="DataLoader workers crash, hang, lose dataset state, or only work under one start method",
        check="Records every DataLoader the entrypoint builds and loads a batch from each under `fork` and `spawn`.",
        measure="Worker failures, timeouts and pickling errors observed per loader and start method; a probe worker that had not started when its timeout ran out (a fresh interpreter starting slowly on a busy machine) is not measured, not a hazard.",
        blocks=Blocks.POLICY,
        impact="The training run stops (or waits forever without a timeout) at this loader.",
        fix="Fix the dataset or collate_fn at the location shown so that its workers start and load under every start method.",
    ),
    Rule(
        category=STREAM_RACE, stage=STAGE, severity=Severity.HIGH,
        description="unsynchronised access to a tensor from two CUDA streams",
        check="Runs the entrypoint under the CUDA sanitizer (CUDA only).",
        measure="Accesses to one tensor from two streams with no synchronisation between them.",
        blocks=Blocks.POLICY,
        impact="The kernels can run in either order: results vary from run to run and can be silently wrong.",
        fix="Make the consuming stream wait for the producer (`stream.wait_stream(other)` or an event record/wait), and call `tensor.record_stream(stream)` for tensors used on a side stream.",
    ),
)
CATEGORIES: frozenset[Category] = frozenset(rule.category for rule in RULES)

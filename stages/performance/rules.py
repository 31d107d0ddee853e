"""The performance stage's rules: memory growth per step, host-device synchronisations, mixed precision, input stalls, regressions against the baseline.

Ids, severities and texts are the report's contract (docs/categories.md is generated from them).
"""

from __future__ import annotations

from traingate.stages.api import Blocks, Category, Rule, Severity

STAGE = "performance"

# The stage's categories (`traingate explain CATEGORY`); a finding's category is one of these objects.
MEMORY_LEAK = Category("memory-leak")
HOST_SYNC = Category("host-sync")
AMP_SPEEDUP = Category("amp-speedup")
AMP_MEMORY = Category("amp-memory")
AMP_ACCURACY = Category("amp-accuracy")
AMP_INACTIVE = Category("amp-inactive")
INPUT_STALL = Category("input-stall")
PERF_REGRESSION = Category("perf-regression")

RULES: tuple[Rule, ...] = (
    Rule(
        category=MEMORY_LEAK, stage=STAGE, severity=Severity.HIGH,
        description="memory held between training steps grows with the number of steps",
        check="Runs the entrypoint instrumented and samples, between optimizer steps, the live tensor memory, the process's host memory "
        "and the steps whose autograd nodes each named tensor's graph holds.",
        measure="A robust slope (Theil-Sen) and trend test (Mann-Kendall) over the steps after warm-up, on tensor bytes and on host memory, "
        "and graphs holding more steps at each check; with the holder and the line that stores into it. Of several names holding the same tensors, the one whose reach "
        "(tensors reachable through its containers) grows from check to check is named. A named graph that held three steps is followed at every step boundary: one "
        "released at every epoch's end is a leak scaling with the epoch's length, high as a per-step leak, projected to the run's epoch length and a ten times longer one.",
        blocks=Blocks.POLICY,
        impact="A long run keeps every step's tensors until it runs out of memory; what fits for a few hundred steps fails hours in.",
        fix="Keep Python numbers or detached values instead of tensors: `losses.append(loss.item())` once per logging interval, "
        "or `loss.detach()` accumulated on the device; bound caches (collections.deque(maxlen=...)) and clear per-epoch lists.",
    ),
    Rule(
        category=HOST_SYNC, stage=STAGE, severity=Severity.MEDIUM,
        description="the training step synchronises host and device (explicit or implicit), per call site",
        check="Runs the entrypoint instrumented and counts host-device synchronisations inside optimizer steps.",
        measure="Every sync (`.item()`, `.cpu()`, `synchronize`, data-dependent branches) counted per call site in the target's code, per step. "
        "On a CPU, only reads of what would live on the device: parameters, buffers, tensors moved with `.to(device)` and what is computed from them; "
        "not tensors that stay on the host (lengths made by a collate, a packed sequence's batch sizes).",
        blocks=Blocks.POLICY,
        impact="Each sync stalls the host until the device has drained its queue, so the host cannot queue the next kernels "
        "ahead of time; the GPU idles between steps by the launch latency of the next step's work.",
        fix="Keep values on the device inside the step (accumulate `loss.detach()` into a tensor, stack per-step values) "
        "and read them back once per epoch or every N steps; replace data-dependent Python branches on tensors with tensor ops.",
    ),
    Rule(
        category=AMP_SPEEDUP, stage=STAGE, severity=Severity.HIGH,
        description="mixed precision is slower than the policy's minimum speedup",
        check="Times the training step with the AMP flag on and off, uninstrumented.",
        measure="Median step time of each setting after warm-up; gates on CUDA only, reported as not applicable elsewhere.",
        blocks=Blocks.POLICY,
        impact="The mixed-precision change does not deliver the speedup the task requires.",
        fix="Check where the step's time goes (the breakdown below): syncs, data waits and small kernels do not get faster in reduced precision.",
    ),
    Rule(
        category=AMP_MEMORY, stage=STAGE, severity=Severity.HIGH,
        description="mixed precision saves less peak memory than the policy's minimum",
        check="Measures peak device memory of the training run with the AMP flag on and off.",
        measure="torch.cuda.max_memory_allocated per setting; gates on CUDA only, reported as not applicable elsewhere.",
        blocks=Blocks.POLICY,
        impact="The mixed-precision change does not deliver the memory saving the task requires.",
        fix="Check what dominates peak memory (parameters and optimizer state stay in fp32 under autocast; activations shrink).",
    ),
    Rule(
        category=AMP_ACCURACY, stage=STAGE, severity=Severity.HIGH,
        description="mixed precision drifts from full precision beyond the tolerance",
        check="Runs the entrypoint with the AMP flag on and off, same seed.",
        measure=(
            "Relative difference of the final loss between the two runs, against `amp_accuracy_tolerance`; it blocks only where its low end "
            "(two standard errors of the paired final steps) lies past the tolerance plus the reduced dtype's unit roundoff (bfloat16 2^-8, float16 2^-11), "
            "else it is reported as not judged: a verdict at its edge would flip with the machine."
        ),
        blocks=Blocks.POLICY,
        impact="Results trained with mixed precision differ from full precision beyond what the task accepts.",
        fix="Keep precision-sensitive computations (losses over large values, reductions, softmax/normalisation) in float32 under autocast, or rescale the values they work on.",
    ),
    Rule(
        category=AMP_INACTIVE, stage=STAGE, severity=Severity.HIGH,
        description="mixed precision was switched on but no reduced-precision compute happened",
        check="Runs the entrypoint with the AMP flag on and counts the dtypes of the compute it dispatches.",
        measure="Operations dispatched in float16/bfloat16 during the AMP-on run.",
        blocks=Blocks.POLICY,
        impact="The run pays for mixed precision (scaler, casts) and gets none of its speed or memory savings; reported AMP results describe full precision.",
        fix="Run the forward pass and the loss inside `with torch.autocast(device_type, dtype=...)`, entered with the AMP flag as `enabled`.",
    ),
    Rule(
        category=INPUT_STALL, stage=STAGE, severity=Severity.MEDIUM,
        description="the training step waits on data loading for a large share of its time",
        check="Runs the entrypoint instrumented and times DataLoader iteration inside each step.",
        measure="Median share of the step spent waiting for the batch (host clock), with the lines sampled while waiting.",
        blocks=Blocks.POLICY,
        impact="The device idles while the host prepares batches: training runs at the data pipeline's speed, not the model's.",
        fix="Make the per-sample work cheaper (precompute, cache decoded samples, avoid I/O or sleeps in __getitem__), "
        "or overlap it with compute: num_workers > 0, persistent_workers=True, prefetch_factor, pin_memory on CUDA.",
    ),
    Rule(
        category=PERF_REGRESSION, stage=STAGE, severity=Severity.HIGH,
        description="step time or peak memory is worse than the baseline beyond measurement noise",
        check="Compares this run's step time with the `--baseline` version's and its peak memory with the baseline report's, metric by metric id. "
        "Where the baseline report's commit is in the clone, the baseline's code is timed in this run, on this machine, alternating with this "
        "version's (A, B, A, B), and the step time is judged from those runs; otherwise a step time stored in the report is compared only "
        "when both were measured on the same machine (CPU model and cores, device, torch build, OpenMP wait policy), both runs had the machine to themselves, and "
        "neither spread more than 15 %: anything else is listed as not comparable, at the top of the performance page, and neither blocks nor passes.",
        measure="Every timing run's OpenMP threads wait passively (`OMP_WAIT_POLICY=PASSIVE` unless set), so that a thread that lost its core to "
        "other work does not hold the others spinning. Beside the baseline's code: each run's lower-quartile step time (the steps load left "
        "alone), this version's over the baseline's in every adjacent pair of runs with its 95 % bootstrap interval, by the step clock (CUDA "
        "events on CUDA) and, on CPU, by the process's CPU time per step (which other processes' load moves far less); slower when by either measure every pair's interval lies above 1.10 and the gap between the "
        "versions' runs is wider than the spread between one version's runs; not measured when the intervals cover 1.10. Stored numbers: the "
        "relative change against max(10 %, 3 x either run's spread). Peak memory, which load does not move: larger by more than 10 %.",
        blocks=Blocks.POLICY,
        impact="This change makes training slower or hungrier than the version it replaces.",
        fix="Compare the time breakdown and memory chart of both reports to find the phase or line that changed. A step time judged not "
        "comparable or not measured was not judged: fetch the baseline's commit (`fetch-depth: 0`) so its code is timed beside this version's.",
        note="A timing that load on the machine could explain (the runs beside each other disagree, or a stored number from another or busy machine) never blocks.",
    ),
)
CATEGORIES: frozenset[Category] = frozenset(rule.category for rule in RULES)

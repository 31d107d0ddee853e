"""Mixed precision on against off: `amp-inactive`, `amp-accuracy`, `amp-speedup`, `amp-memory`.

Two timing runs (the entrypoint with its AMP flag off, then on, the same seed, only the step
clock installed) give the median step time and spread after warm-up, the peak device memory
(CUDA's max_memory_allocated; a CPU has no allocator statistics, so it is not measured
there) and the loss curve. The instrumented run (AMP on) counts matrix products by input
dtype at the dispatcher: AMP that is on but never computed a matmul in float16/bfloat16 is
`amp-inactive`. The loss drift is relative: |final_amp - final_fp32| / |final_fp32|, the
final loss being the mean of the last few steps' losses. It blocks only where it lies past the
tolerance beyond what this device's run explains: the step-to-step spread of the paired AMP
and fp32 losses over those steps (two standard errors) and the rounding of the reduced dtype
the run computed in (its unit roundoff: 2^-8 for bfloat16, as a CPU's autocast uses, 2^-11
for float16). A drift over the tolerance within that margin is reported as not judged: the
same commit would pass on one CPU and block on another. Speed and memory targets gate on
CUDA only; on a CPU they are measured and shown as not applicable.

The speedup is a ratio of median step times with its bootstrap interval over the steps
(stages/performance/spread.py); "within noise" when that interval covers 1. A speedup under
the target whose interval reaches it is not measured (the runs' noise covers what it would
judge), never an `amp-speedup` finding. When AMP was on
but no matrix product ran in reduced precision, both timing runs computed in fp32: no
speedup or memory reduction is reported, only that AMP was not active.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from traingate.stages.performance.config import PerformancePolicy
from traingate.stages.performance.details import AmpComparison, AmpSide, AmpSides
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Metric, Severity
from traingate.stages.base import StageContext, location_of
from traingate.stages.performance.probe.payloads import AmpCounts, SiteKey, StepClockRecord
from traingate.stages.performance.spread import RatioSpread, ratio_of_medians
from traingate.stages.performance.timing import step_stats, step_times
from traingate.stages.performance.rules import AMP_ACCURACY, AMP_INACTIVE, AMP_MEMORY, AMP_SPEEDUP

FINAL_STEPS = 5
# The relative error one rounding to each reduced dtype makes (half its machine epsilon).
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
NOT_ON_CPU = "not applicable on cpu: gates on CUDA only"
NOT_A_RATIO = "; a ratio between two fp32 runs is noise, not an AMP effect"


def final_loss(losses: list[float | None]) -> tuple[float | None, int]:
    """Mean of the last FINAL_STEPS recorded losses, and how many it averaged."""
    values = [v for v in losses if v is not None]
    tail = values[-FINAL_STEPS:]
    return (sum(tail) / len(tail), len(tail)) if tail else (None, 0)


def amp_active(amp_counts: AmpCounts | None) -> bool | None:
    """Did the AMP run compute in reduced precision? From the instrumented AMP run's matrix
    products by dtype: None when they were not counted or there were none."""
    if not amp_counts:
        return None
    total = sum(amp_counts.matmul_dtypes_in_steps.values())
    return None if total == 0 else amp_counts.reduced_in_steps > 0


def reduced_dtype(amp_counts: AmpCounts | None) -> str | None:
    """The reduced dtype the AMP run's matrix products used most in its steps."""
    if not amp_counts:
        return None
    counts = {name.removeprefix("torch."): n for name, n in amp_counts.matmul_dtypes_in_steps.items()}
    reduced = [(n, name) for name, n in counts.items() if name in UNIT_ROUNDOFF and n > 0]
    return max(reduced)[1] if reduced else None


def drift_interval(fp32: list[float | None], amp: list[float | None]) -> tuple[float, float] | None:
    """(low, high) of the relative drift from the paired losses of the last FINAL_STEPS steps
    both runs recorded: their mean difference over the fp32 mean, two standard errors either
    side (the same seed and data make each step a pair); None with no pair."""
    pairs = [(a, b) for a, b in zip(fp32, amp, strict=False) if a is not None and b is not None][-FINAL_STEPS:]
    if not pairs:
        return None
    base = abs(sum(a for a, _ in pairs) / len(pairs))
    if base == 0:
        return None
    diffs = [(b - a) / base for a, b in pairs]
    mean = sum(diffs) / len(diffs)
    margin = 2 * (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs)) ** 0.5 if len(diffs) > 1 else 0.0
    return max(0.0, abs(mean) - margin), abs(mean) + margin


def _side(clock: StepClockRecord, warmup: int, min_steps: int) -> AmpSide:
    stats = step_stats(clock, warmup, min_steps)
    loss, averaged = final_loss(clock.losses)
    return AmpSide(steps=clock.steps, step=stats.record() if stats else None, peak_memory_bytes=clock.peak_memory_bytes, final_loss=loss, final_loss_steps=averaged, losses=list(clock.losses))


def compare(fp32: StepClockRecord, amp: StepClockRecord, warmup: int, min_steps: int, device: str, active: bool | None = None, reduced: str | None = None) -> AmpComparison:
    """The side-by-side numbers. With `active` False (no matrix product ran in reduced
    precision with AMP on) both runs computed in fp32: their time and memory ratios are
    noise between two like runs, not what AMP does, so none is reported."""
    sides = AmpSides(fp32=_side(fp32, warmup, min_steps), amp=_side(amp, warmup, min_steps))
    s32, samp = sides.fp32.step, sides.amp.step
    spread = ratio_of_medians(step_times(fp32, warmup), step_times(amp, warmup)) if s32 and samp and active is not False else None
    speedup = spread.ratio if spread else None
    p32, pamp = sides.fp32.peak_memory_bytes, sides.amp.peak_memory_bytes
    reduction = 1 - pamp / p32 if p32 and pamp is not None and active is not False else None
    l32, lamp = sides.fp32.final_loss, sides.amp.final_loss
    drift = abs(lamp - l32) / abs(l32) if l32 not in (None, 0) and lamp is not None else None
    interval = drift_interval(fp32.losses, amp.losses) if drift is not None else None
    return AmpComparison(
        device=device,
        sides=sides,
        active=active,
        speedup=speedup,
        speedup_spread=spread.record() if spread else None,
        memory_reduction=reduction,
        loss_drift=drift,
        loss_drift_interval=interval,
        reduced_dtype=reduced,
        drift_explained=UNIT_ROUNDOFF.get(reduced or "", 0.0),
    )


def _speedup_spread(comparison: AmpComparison) -> RatioSpread | None:
    record = comparison.speedup_spread
    return RatioSpread(record.ratio, record.low, record.high, record.method) if record else None


def under_floor_within_noise(spread: RatioSpread | None, floor: float) -> bool:
    """A speedup under `floor` whose interval reaches it: the two runs' noise covers the
    difference it would judge, so it is not measured rather than missed."""
    return spread is not None and spread.ratio < floor <= spread.high


def metrics(comparison: AmpComparison, policy: PerformancePolicy, amp_counts: AmpCounts | None) -> list[Metric]:
    device = comparison.device
    cuda = device == "cuda"
    inactive = comparison.active is False
    out = [_speedup_metric(comparison, policy)]
    reduction = comparison.memory_reduction
    out.append(Metric(
        id="amp.memory_reduction",
        name="AMP peak memory reduction",
        value=round(reduction, 4) if reduction is not None else None,
        unit="fraction",
        threshold=policy.amp_memory_reduction_min,
        passed=(reduction >= policy.amp_memory_reduction_min) if cuda and reduction is not None else None,
        note=(
            f"not measured: AMP was not active{NOT_A_RATIO}" if inactive
            else "torch.cuda.max_memory_allocated of each timing run" if cuda
            else f"not measured on cpu (no allocator statistics without instrumenting every allocation, which would distort the timing runs); {NOT_ON_CPU}"
        ),
    ))
    drift = comparison.loss_drift
    out.append(Metric(
        id="amp.loss_drift",
        name="AMP final loss drift (relative)",
        value=round(drift, 6) if drift is not None else None,
        unit="fraction",
        threshold=policy.amp_accuracy_tolerance,
        passed=_drift_passed(comparison, policy),
        note=_drift_note(comparison, policy),
    ))
    if amp_counts is not None:
        reduced = amp_counts.reduced_in_steps
        total = sum(amp_counts.matmul_dtypes_in_steps.values())
        out.append(Metric(
            id="amp.reduced_matmuls",
            name="AMP reduced-precision matrix products in training steps",
            value=reduced,
            unit="ops",
            note=f"of {total} matrix products (mm/addmm/bmm/conv/attention) in the instrumented AMP run: {amp_counts.matmul_dtypes_in_steps}",
        ))
    return out


def _speedup_metric(comparison: AmpComparison, policy: PerformancePolicy) -> Metric:
    """The speedup, judged on CUDA only, and not where the runs' noise covers the target."""
    cuda = comparison.device == "cuda"
    speedup = comparison.speedup
    spread = _speedup_spread(comparison)
    inactive = comparison.active is False
    if inactive:
        speed_note = f"not measured: AMP was not active (no matrix product ran in float16/bfloat16 with AMP on), so both timing runs computed in fp32{NOT_A_RATIO}"
    elif speedup is None or spread is None:
        speed_note = "not measured: fewer profiled steps than performance.min_steps"
    elif cuda and under_floor_within_noise(spread, policy.amp_speedup_min):
        speed_note = f"not measured: {spread.describe()} is under the {policy.amp_speedup_min}x target, but its interval reaches it: the runs' noise covers what it would judge"
    elif cuda:
        speed_note = f"{spread.describe()}, ratio of median step times, CUDA event timing over the steps after warm-up"
    else:
        speed_note = f"measured {spread.describe()} on cpu, {NOT_ON_CPU}"
    return Metric(
        id="amp.speedup",
        name="AMP speedup (fp32 median step / AMP median step)",
        value=round(speedup, 3) if speedup is not None else None,
        unit="x",
        threshold=policy.amp_speedup_min,
        passed=(speedup >= policy.amp_speedup_min) if cuda and speedup is not None and not under_floor_within_noise(spread, policy.amp_speedup_min) else None,
        note=speed_note,
    )


def amp_location(amp_counts: AmpCounts | None, forward_sites: list[tuple[SiteKey, int]]) -> Location | None:
    uses = [u for u in amp_counts.autocast if u.site] if amp_counts else []
    enabled = sorted((u for u in uses if u.enabled), key=lambda u: -u.entries)
    site = enabled[0].site if enabled else (uses[0].site if uses else (forward_sites[0][0] if forward_sites else None))
    return location_of(site)


@dataclass(frozen=True)
class CudaGate:
    """Where the target's code switches AMP on only on one side of a device check."""

    path: str  # relative to the target root
    line: int
    code: str  # the check's source, at most 200 characters
    enables: str  # "only on CUDA" or "only off the CPU"


def cuda_only_gate(root: Path, names: set[str], files: list[str]) -> CudaGate | None:
    """Where the target switches AMP on only on CUDA, in the files the training ran through
    (then the rest of the target's files, a bounded few). Two shapes:
    - an `and` of the flag with a CUDA check (`use_amp and torch.cuda.is_available()`,
      `self.use_amp and device.type == "cuda"`);
    - a conditional expression or `if` statement whose test is a device check and whose branch
      on the non-CPU side builds the autocast (`nullcontext() if device_type == "cpu" else
      torch.amp.autocast(...)`, `if device.type == "cuda": with torch.autocast(...)`).
    The result's `enables` says on which side of the check AMP is on."""
    seen: set[Path] = set()
    candidates = [root / f for f in files] + sorted(p for p in root.rglob("*.py") if not _skipped(p.relative_to(root)))[:_MAX_SCANNED_FILES]
    for path in candidates:
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            source = path.read_text(errors="replace")
            tree = ast.parse(source)
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
                flagged = any(_names_flag(value, names) for value in node.values)
                if flagged and any(_checks_cuda(value) for value in node.values):
                    code = ast.get_source_segment(source, node) or ""
                    return CudaGate(str(path.relative_to(root)), node.lineno, code[:200], "only on CUDA")
            elif isinstance(node, (ast.IfExp, ast.If)):
                gate = _device_chosen_autocast(node, source)
                if gate is not None:
                    return CudaGate(str(path.relative_to(root)), node.lineno, *gate)
    return None


_MAX_SCANNED_FILES = 200


def _skipped(rel: Path) -> bool:
    return any(part.startswith(".") or part in ("tests", "test", "venv", "site-packages", "node_modules", "__pycache__") for part in rel.parts)


def _names_flag(node: ast.AST, names: set[str]) -> bool:
    return (isinstance(node, ast.Name) and node.id in names) or (isinstance(node, ast.Attribute) and node.attr in names)


def _checks_cuda(node: ast.AST) -> bool:
    """`torch.cuda.is_available()`, a comparison with "cuda", `x.is_cuda`, `on_cuda`-like names."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and (sub.attr in ("is_cuda",) or (sub.attr == "is_available" and isinstance(sub.value, ast.Attribute) and sub.value.attr == "cuda")):
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.startswith("cuda"):
            return True
        if isinstance(sub, ast.Name) and "cuda" in sub.id.lower():
            return True
    return False


def _device_chosen_autocast(node: ast.IfExp | ast.If, source: str) -> tuple[str, str] | None:
    """(`code`, `enables`) of a conditional whose test is a device check and whose non-CPU
    branch builds the autocast; None for any other conditional."""
    on_gpu_when_true = _device_test(node.test)
    if on_gpu_when_true is None:
        return None
    if isinstance(node, ast.IfExp):
        gpu_side: list[ast.AST] = [node.body if on_gpu_when_true else node.orelse]
        code = ast.get_source_segment(source, node) or ""
    else:
        gpu_side = list(node.body if on_gpu_when_true else node.orelse)
        code = f"if {ast.get_source_segment(source, node.test) or ''}:"
    if not any(_builds_autocast(sub) for branch in gpu_side for sub in ast.walk(branch)):
        return None
    cpu_test = any(isinstance(sub, ast.Constant) and sub.value == "cpu" for sub in ast.walk(node.test))
    return code[:200], "only off the CPU" if cpu_test else "only on CUDA"


def _device_test(test: ast.AST) -> bool | None:
    """Whether `test` holds on the GPU (True) or on the CPU (False), for a device check:
    a comparison of a device-like name or attribute with "cpu" or "cuda" (`device_type ==
    "cpu"`, `x.device.type != "cuda"`, `"cuda" in device`), `torch.cuda.is_available()`,
    `x.is_cuda`, their negation, or an `and`/`or` that such a check decides. None otherwise."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _device_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        sides = [_device_test(value) for value in test.values]
        # An `and` is true only where each of its terms is: one GPU-only term makes it
        # GPU-only. An `or` is false only where each term is: one CPU-only term makes its
        # false side GPU-only.
        decisive = isinstance(test.op, ast.And)
        return decisive if decisive in sides else None
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr == "is_available":
        owner = test.func.value
        return True if isinstance(owner, ast.Attribute) and owner.attr == "cuda" else None
    if isinstance(test, ast.Attribute) and test.attr == "is_cuda":
        return True
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, (ast.In, ast.NotIn)):
        device, named = right, _device_name(left)
        negated = isinstance(op, ast.NotIn)
    elif isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
        device, named = (right, _device_name(left)) if _device_name(left) is not None else (left, _device_name(right))
        negated = isinstance(op, (ast.NotEq, ast.IsNot))
    else:
        return None
    if named is None or not _device_like(device):
        return None
    return named != negated


def _device_name(node: ast.AST) -> bool | None:
    """For a "cuda…" string constant True, for "cpu" False, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value.startswith("cuda"):
            return True
        if node.value == "cpu":
            return False
    return None


def _device_like(node: ast.AST) -> bool:
    """`device`, `device_type`, `self.device`, `x.device.type`: what names a device."""
    if isinstance(node, ast.Name):
        return "device" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "device" in node.attr.lower() or (node.attr == "type" and _device_like(node.value))
    return False


def _builds_autocast(node: ast.AST) -> bool:
    """A call of `autocast(...)`: torch.autocast, torch.amp.autocast, torch.cuda.amp.autocast."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "autocast") or (isinstance(func, ast.Attribute) and func.attr == "autocast")


def amp_flag_names(flag: str, amp_on_args: list[str]) -> set[str]:
    """The names the target's code may read the AMP switch by: the keyword, or for a script
    the option names of its `amp_args.on` (`--amp` is `args.amp`)."""
    if flag != "amp_args":
        return {flag}
    return {arg.split("=", 1)[0].lstrip("-").replace("-", "_") for arg in amp_on_args if arg.startswith("-")}


def amp_on_setting(flag: str, amp_on_args: list[str]) -> str:
    """How the messages name the run with AMP on: `use_amp=True` for a keyword, the script's
    `amp_args.on` for a script (whose switch is arguments, not a keyword set to True)."""
    if flag != "amp_args":
        return f"`{flag}=True`"
    return f"the script's AMP arguments (`{' '.join(amp_on_args)}`)" if amp_on_args else "the script's AMP arguments (none given)"


def _amp_on_args(ctx: StageContext) -> list[str]:
    ep = ctx.config.entrypoint
    return list(ep.amp_args.on) if ep is not None and ep.amp_args is not None else []


def not_applicable_metric(gate: CudaGate, setting: str, device: str) -> Metric:
    """The `amp-inactive` check on a device where the target deliberately leaves AMP off;
    `setting` is the run with AMP on, as `amp_on_setting` names it."""
    return Metric(
        id="amp.active",
        name="AMP active (reduced-precision matrix products with AMP on)",
        value=None,
        note=(
            f"not applicable on {device}: the target enables AMP {gate.enables} (`{gate.code}` at {gate.path}:{gate.line}), "
            f"so with {setting} it computed in fp32 here as intended; check it on a GPU runner with "
            "`traingate run <target> --device cuda --stages performance`"
        ),
    )


def inactive_check(ctx: StageContext, amp_counts: AmpCounts | None, forward_sites: list[tuple[SiteKey, int]], flag: str, device: str) -> tuple[Finding | None, list[Metric]]:
    """`amp-inactive` and, where the target deliberately leaves AMP off on this device, the
    metric that says the check is not applicable here and how to run it where it is."""
    if not amp_counts:
        return None, []
    gate = None
    on_args = _amp_on_args(ctx)
    if device != "cuda" and amp_active(amp_counts) is False:
        files = [str(site[0][0]) for site in forward_sites if site and site[0]] + [str(u.site[0]) for u in amp_counts.autocast if u.site]
        gate = cuda_only_gate(ctx.root, amp_flag_names(flag, on_args), list(dict.fromkeys(files)))
    finding = inactive_finding(ctx, amp_counts, forward_sites, flag, device, gate)
    if finding is None and gate is not None:
        return None, [not_applicable_metric(gate, amp_on_setting(flag, on_args), device)]
    return finding, []


def inactive_finding(
    ctx: StageContext, amp_counts: AmpCounts, forward_sites: list[tuple[SiteKey, int]], flag: str, device: str, cuda_gate: CudaGate | None = None
) -> Finding | None:
    """`amp-inactive`: AMP switched on, yet no matrix product ran in reduced precision.

    Not on a device other than CUDA when autocast was never entered (or entered disabled) and
    the target's code switches AMP on only on CUDA (`cuda_gate`): there it is not applicable
    (the caller says so in a metric). Autocast entered while the forward pass runs outside it
    is reported on every device."""
    dtypes = amp_counts.matmul_dtypes_in_steps
    total = sum(dtypes.values())
    if total == 0 or amp_counts.reduced_in_steps > 0:
        return None
    script = flag == "amp_args"
    switch = "the script's AMP arguments" if script else "the flag"
    uses = [u for u in amp_counts.autocast if u.site]
    empty = sorted((u for u in uses if u.enabled), key=lambda u: -u.entries)
    disabled = [u for u in uses if not u.enabled]
    if not empty and device != "cuda" and cuda_gate is not None:
        return None
    if empty:
        use = empty[0]
        site = use.site
        cause = (
            f"autocast({use.device}, {use.dtype}) was entered {use.entries} times at {_at(site)}, "
            f"but {sum(use.matmuls.values())} matrix products ran inside it; the forward pass runs outside the `with` block"
        )
    elif disabled:
        site = disabled[0].site
        cause = f"autocast was entered at {_at(site)} with enabled=False: {switch} {'do' if script else 'does'} not reach it"
    else:
        site = forward_sites[0][0] if forward_sites else None
        cause = f"autocast was never entered: {switch} {'switch' if script else 'switches'} nothing on"
    location = location_of(site)
    return ctx.finding(
        category=AMP_INACTIVE,
        severity=Severity.HIGH,
        title="Mixed precision is switched on but no computation ran in reduced precision",
        location=location,
        problem=f"With {amp_on_setting(flag, _amp_on_args(ctx))}, all {total} matrix products of the training steps ran in {', '.join(sorted(dtypes))}; {cause}.",
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"0 of {total} matrix products in float16/bfloat16 on {device}",
            data={"matmul_dtypes_in_steps": dict(dtypes), "autocast": [u.model_dump(mode="json", exclude_unset=True) for u in amp_counts.autocast], "amp_flag": flag, "device": device},
        ),
        key="amp-inactive",
    )


def _at(site: SiteKey | None) -> str:
    """`path:line` of a site the caller kept only when it was set."""
    return f"{site[0]}:{site[1]}" if site else ""


def accuracy_finding(ctx: StageContext, comparison: AmpComparison, policy: PerformancePolicy, location: Location | None) -> Finding | None:
    drift = comparison.loss_drift
    sides = comparison.sides
    l32, lamp = sides.fp32.final_loss, sides.amp.final_loss
    # A drift is measured only from both final losses, and judged only past its margin.
    if drift is None or l32 is None or lamp is None or not drift_past_tolerance(comparison, policy):
        return None
    low, high = comparison.loss_drift_interval or (drift, drift)
    return ctx.finding(
        category=AMP_ACCURACY,
        severity=Severity.HIGH,
        title=f"Mixed precision changes the final loss by {drift:.1%} (tolerance {policy.amp_accuracy_tolerance:.1%})",
        location=location,
        problem=(
            f"Same seed and data, the final loss (mean of the last {sides.amp.final_loss_steps} steps) is {lamp:.6g} with AMP "
            f"and {l32:.6g} without: a relative drift of {drift:.2%} ({low:.2%} to {high:.2%} over the paired steps), above the policy's "
            f"{policy.amp_accuracy_tolerance:.2%} by more than {_explained(comparison)} explains."
        ),
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"final loss {lamp:.6g} (amp) vs {l32:.6g} (fp32) on {comparison.device}",
            data={
                "final_loss_amp": lamp,
                "final_loss_fp32": l32,
                "relative_drift": drift,
                "relative_drift_interval": [low, high],
                "tolerance": policy.amp_accuracy_tolerance,
                "reduced_dtype": comparison.reduced_dtype,
                "explained_by_precision": comparison.drift_explained,
                "averaged_steps": sides.amp.final_loss_steps,
                "device": comparison.device,
                "loss_curve_fp32": sides.fp32.losses[-20:],
                "loss_curve_amp": sides.amp.losses[-20:],
            },
        ),
        key="amp-accuracy",
    )


def drift_past_tolerance(comparison: AmpComparison, policy: PerformancePolicy) -> bool:
    """The drift's low end lies past the tolerance plus what the reduced dtype's rounding
    explains: a verdict another CPU's run would give too."""
    drift = comparison.loss_drift
    if drift is None or drift <= policy.amp_accuracy_tolerance:
        return False
    low = comparison.loss_drift_interval[0] if comparison.loss_drift_interval else drift
    return low > policy.amp_accuracy_tolerance + (comparison.drift_explained or 0.0)


def _drift_passed(comparison: AmpComparison, policy: PerformancePolicy) -> bool | None:
    """Met, missed, or None: not measured, or over the tolerance within its margin (not judged)."""
    drift = comparison.loss_drift
    if drift is None:
        return None
    if drift <= policy.amp_accuracy_tolerance:
        return True
    return False if drift_past_tolerance(comparison, policy) else None


def _explained(comparison: AmpComparison) -> str:
    dtype = comparison.reduced_dtype
    return f"{dtype}'s rounding ({comparison.drift_explained:.2%}) and the step-to-step spread" if dtype else "the step-to-step spread"


def _drift_note(comparison: AmpComparison, policy: PerformancePolicy) -> str:
    drift, device = comparison.loss_drift, comparison.device
    if drift is None:
        return "not measured: no scalar loss was backpropagated"
    note = f"mean of the last {comparison.sides.amp.final_loss_steps} step losses, AMP vs fp32, on {device}"
    if drift > policy.amp_accuracy_tolerance and not drift_past_tolerance(comparison, policy):
        low, high = comparison.loss_drift_interval or (drift, drift)
        note += f"; not judged: {low:.2%} to {high:.2%} over the paired steps, within the tolerance plus what {_explained(comparison)} explain"
    return note


def target_findings(ctx: StageContext, comparison: AmpComparison, policy: PerformancePolicy, location: Location | None) -> list[Finding]:
    """`amp-speedup` and `amp-memory`: on CUDA only, where the targets gate."""
    if comparison.device != "cuda":
        return []
    out = []
    sides = comparison.sides
    speedup = comparison.speedup
    spread = _speedup_spread(comparison)
    fp32_step, amp_step = sides.fp32.step, sides.amp.step
    # A speedup is measured only from both runs' step times.
    # A speedup whose interval reaches the target is not measured (noise), never a finding.
    if speedup is not None and speedup < policy.amp_speedup_min and fp32_step is not None and amp_step is not None and not under_floor_within_noise(spread, policy.amp_speedup_min):
        out.append(ctx.finding(
            category=AMP_SPEEDUP,
            severity=Severity.HIGH,
            title=f"Mixed precision speeds a step up {speedup:.2f}x, under the {policy.amp_speedup_min}x target",
            location=location,
            problem=(
                f"Median step {fp32_step.median_ms:.2f} ms in fp32 against {amp_step.median_ms:.2f} ms with AMP "
                f"over {amp_step.steps} steps after warm-up (CUDA event timing): {spread.describe() if spread else f'{speedup:.2f}x'}."
            ),
            evidence=Evidence(kind=EvidenceKind.MEASURED, summary=f"{speedup:.3f}x on cuda", data={
                "speedup": speedup, "speedup_spread": comparison.speedup_spread.data() if comparison.speedup_spread else None,
                "fp32": fp32_step.data(), "amp": amp_step.data(), "threshold": policy.amp_speedup_min,
            }),
            key="amp-speedup",
        ))
    reduction = comparison.memory_reduction
    peak32, peak_amp = sides.fp32.peak_memory_bytes, sides.amp.peak_memory_bytes
    if reduction is not None and reduction < policy.amp_memory_reduction_min:
        out.append(ctx.finding(
            category=AMP_MEMORY,
            severity=Severity.HIGH,
            title=f"Mixed precision saves {reduction:.0%} of peak memory, under the {policy.amp_memory_reduction_min:.0%} target",
            location=location,
            problem=f"Peak allocated memory {peak32:,} bytes in fp32 against {peak_amp:,} bytes with AMP.",
            evidence=Evidence(kind=EvidenceKind.MEASURED, summary=f"{reduction:.3f} reduction on cuda", data={"reduction": reduction, "peak_fp32": peak32, "peak_amp": peak_amp, "threshold": policy.amp_memory_reduction_min}),
            key="amp-memory",
        ))
    return out

"""Step times, where a step's time goes, and `input-stall`.

All numbers come from the timing runs, which carry only the step clock (no dispatch mode, no
sampler), over the steps after warm-up. On CUDA the step time is read from CUDA events
recorded at each step boundary (the device's timeline, no sync per step); the data wait is
always host time, since waiting for a batch is the host's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median, quantiles

from traingate.stages.performance.details import Breakdown, LoaderSummary, Phase, PhaseShare, SampledLine, StallDetails, StepRecord
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, location_of
from traingate.stages.performance.probe.payloads import FullPayload, LoaderRecord, PhaseTimes, StepClockRecord
from traingate.stages.performance.sign_test import sign_test
from traingate.stages.performance.rules import INPUT_STALL

PHASES: tuple[Phase, ...] = ("data", "forward", "backward", "optimizer", "rest")
STALL_SHARE = 0.5  # input-stall: the median step waits for data more than half its time
STALL_HIGH_SHARE = 0.8
CATEGORY = INPUT_STALL


@dataclass(frozen=True)
class StepStats:
    steps: int
    median_s: float
    iqr_s: float
    mad_s: float
    clock: str  # "cuda events" or "host"

    def record(self) -> StepRecord:
        return StepRecord(steps=self.steps, median_ms=self.median_s * 1e3, iqr_ms=self.iqr_s * 1e3, mad_ms=self.mad_s * 1e3, clock=self.clock)


def profiled(values: list[float], warmup: int) -> list[float]:
    return values[warmup:] if len(values) > warmup else []


def step_times(clock: StepClockRecord, warmup: int) -> list[float]:
    """The step times after warm-up, in seconds: CUDA events where the run has them, else host."""
    source = clock.device if clock.device is not None else clock.host
    return profiled(source.step, warmup)


def step_stats(clock: StepClockRecord, warmup: int, min_steps: int) -> StepStats | None:
    """Median and spread of the step time; None with fewer than `min_steps` after warm-up."""
    name = "cuda events" if clock.device is not None else "host"
    times = step_times(clock, warmup)
    if len(times) < max(min_steps, 2):
        return None
    q1, _, q3 = quantiles(times, n=4, method="inclusive")
    mid = median(times)
    return StepStats(len(times), mid, q3 - q1, median(abs(t - mid) for t in times), name)


def _phases(times: PhaseTimes) -> dict[str, list[float]]:
    return {"data": times.data, "forward": times.forward, "backward": times.backward, "optimizer": times.optimizer, "rest": times.rest}


def breakdown(clock: StepClockRecord, warmup: int, run: str, rest_sites: list[SampledLine]) -> Breakdown | None:
    """Mean time per step in each phase (device clock on CUDA, else host) and its share, of
    the timing run labelled `run`; `rest_sites` are the lines sampled in "rest"."""
    source = clock.device if clock.device is not None else clock.host
    phases = _phases(source)
    totals = {p: sum(profiled(phases[p], warmup)) for p in PHASES}
    steps = len(profiled(source.step, warmup))
    whole = sum(totals.values())
    if steps == 0 or whole <= 0:
        return None
    return Breakdown(
        steps=steps,
        clock="cuda events" if clock.device is not None else "host",
        phases=[PhaseShare(phase=p, mean_ms=totals[p] / steps * 1e3, share=totals[p] / whole) for p in PHASES],
        run=run,
        rest_sites=rest_sites,
    )


def training_loader(clock: StepClockRecord) -> LoaderRecord | None:
    """The loader that fed the training steps (its batch was the last fetched before most
    optimizer steps); an evaluation loader iterated between epochs is not it."""
    loaders = [loader for loader in clock.loaders if loader.fed_steps]
    return max(loaders, key=lambda loader: loader.fed_steps) if loaders else None


def wait_shares(clock: StepClockRecord, warmup: int, loader: LoaderRecord) -> list[float]:
    """Per profiled step: time waiting for `loader` / the step's time (host clock)."""
    steps = clock.host.step
    waits = loader.step_waits
    return [waits.get(str(i), 0.0) / steps[i] for i in range(warmup, len(steps)) if steps[i] > 0]


def sampled_sites(profile: FullPayload, phase: str = "rest", limit: int = 8) -> list[SampledLine]:
    """The heaviest target lines sampled in `phase` in the instrumented run: "rest" (outside
    data, forward, backward and optimizer) or "data" (the main process producing a batch,
    as with num_workers=0)."""
    sampler = profile.sampler
    interval = sampler.interval_s
    rows = [s for s in sampler.samples if s.phase == phase and s.site]
    return [SampledLine(site=s.site, samples=s.count, approx_ms=s.count * interval * 1e3) for s in rows[:limit] if s.site]


def input_stall(ctx: StageContext, clock: StepClockRecord, warmup: int, min_steps: int, label: str, data_sites: list[SampledLine] | None = None) -> tuple[StallDetails, Finding | None]:
    """`input-stall`: the training step waits on data loading for a large share of its time."""
    loader = training_loader(clock)
    shares = wait_shares(clock, warmup, loader) if loader else []
    public = LoaderSummary.model_validate(loader.model_dump(exclude={"step_waits"})) if loader else None
    if loader is None or not shares:
        # No sign test on no steps: the record leaves it out.
        return StallDetails(steps=len(shares), median_share=median(shares) if shares else None, loader=public, min_steps=min_steps, decided=False), None
    # Enough steps decide by the median; fewer decide when the sign test is decisive
    # either way (every one of 5 steps above the threshold: p = 0.031).
    test = sign_test(shares, STALL_SHARE)
    share = median(shares)
    decided = len(shares) >= min_steps or test.decisive_above or test.decisive_below
    summary = StallDetails(steps=len(shares), median_share=share, loader=public, min_steps=min_steps, sign_test=test.record("wait on data above the threshold"), decided=decided)
    if not decided or share <= STALL_SHARE or (len(shares) < min_steps and not test.decisive_above):
        return summary, None
    location = _loader_location(loader)
    host = clock.host
    waits = loader.step_waits
    data_ms = median(waits.get(str(i), 0.0) for i in range(warmup, len(host.step))) * 1e3
    step_ms = median(profiled(host.step, warmup)) * 1e3
    settings = loader.settings
    severity = Severity.HIGH if share >= STALL_HIGH_SHARE else Severity.MEDIUM
    where = "its `__getitem__`" if loader.getitem else "the DataLoader built here"
    if data_sites:
        top = data_sites[0].site
        where += f" (most sampled line while waiting: {top[0]}:{top[1]} in `{top[2]}`)"
    finding = ctx.finding(
        category=CATEGORY,
        severity=severity,
        title=f"Training steps wait on data loading {share:.0%} of their time",
        location=location,
        problem=(
            f"Over {len(shares)} steps after warm-up ({label} run), the median step spent {data_ms:.1f} ms of {step_ms:.1f} ms "
            f"waiting for its batch ({share:.0%}); the loader uses num_workers={settings.num_workers}, "
            f"batch_size={settings.batch_size}. The time goes to {where}. Decided by the {test.statement('above the ' + format(STALL_SHARE, '.0%') + ' threshold')}."
        ),
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"median wait {data_ms:.2f} ms of a {step_ms:.2f} ms step ({share:.0%}) over {len(shares)} steps; sign test p = {test.p_value:.3g}",
            data={
                "median_wait_share": round(share, 4),
                "median_wait_ms": round(data_ms, 3),
                "median_step_ms": round(step_ms, 3),
                "steps": len(shares),
                "threshold_share": STALL_SHARE,
                "sign_test": test.record(f"above the {STALL_SHARE:.0%} threshold").data(),
                "loader": {"dataset": loader.dataset, "created_at": list(loader.site) if loader.site is not None else None, **settings.model_dump(mode="json", exclude_unset=True)},
                "run": label,
                "clock": "host",
                "sampled_lines_while_waiting": [s.data() for s in data_sites or []],
            },
        ),
        key=f"input-stall {loader.dataset}",
    )
    return summary, finding


def _loader_location(loader: LoaderRecord) -> Location | None:
    return location_of(loader.getitem or loader.site)

"""Does the memory held between training steps grow with the number of steps?

The series is the memory held at each step boundary after warm-up (exact live tensor bytes
on a CPU, `torch.cuda.memory_allocated` on CUDA). A loop leaks when all of these hold:

- the Theil-Sen slope (median of all pairwise slopes; one outlier step cannot move it) is at
  least `MIN_SLOPE_BYTES` per step: smaller growth is a few scalars, nothing that matters;
- the growth over the window (slope x steps) is at least three times the noise, the robust
  spread (1.4826 x MAD) of the residuals around that line;
- it is steady: the series cut in three consecutive segments has both its low and its high
  (10th and 90th percentiles) rising from each segment to the next. Memory that plateaus (optimizer state made
  at the first step, a cache that fills up and stays full), a bounded sawtooth (a list
  cleared every epoch), and a one-off jump all fail this: their later segments do not sit
  above the earlier ones at both ends.

Least-squares slope and r^2, the fraction of step-to-step increases and the Mann-Kendall z
are reported with the verdict; r^2 also grades the severity (how steady the growth is).
Pure Python on purpose: the stage process has no reason to import numpy or torch.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import math
from dataclasses import dataclass
from statistics import median

from traingate.stages.performance.details import LeakRecord
from traingate.stages.performance.sign_test import sign_test

MIN_SLOPE_BYTES = 64.0
# The host memory's floor (probe/host_memory.py). Clean loops under the full probe grow the
# host heap by 0.2-1.5 KiB a step on the clean fixtures and 0.5-3 KiB on real repos
# (Theil-Sen over 20-40 steps: the probe's own step records, one-off caches at the checks):
# 16 KiB is over five times the largest.
HOST_MIN_SLOPE_BYTES = 16384.0
NOISE_FACTOR = 3.0
SEGMENTS = 3


@dataclass(frozen=True)
class LeakVerdict:
    leak: bool
    reason: str
    steps: int
    slope_bytes_per_step: float  # Theil-Sen
    ls_slope_bytes_per_step: float
    r2: float
    increasing_fraction: float
    mann_kendall_z: float
    total_growth_bytes: float  # last minus first value of the window
    start_bytes: float
    noise_bytes: float
    segments: list[tuple[float, float]]  # (10th, 90th percentile) of each segment

    def record(self) -> LeakRecord:
        """The report's record: the statistics to 4 digits (the segments as measured)."""
        return LeakRecord(
            leak=self.leak, reason=self.reason, steps=self.steps, slope_bytes_per_step=round(self.slope_bytes_per_step, 4),
            ls_slope_bytes_per_step=round(self.ls_slope_bytes_per_step, 4), r2=round(self.r2, 4), increasing_fraction=round(self.increasing_fraction, 4),
            mann_kendall_z=round(self.mann_kendall_z, 4), total_growth_bytes=round(self.total_growth_bytes, 4), start_bytes=round(self.start_bytes, 4),
            noise_bytes=round(self.noise_bytes, 4), segments=list(self.segments),
        )


def theil_sen(values: list[float]) -> tuple[float, float]:
    """Slope and intercept; the slope is the median of pairwise slopes (subsampled above
    400 points to keep it O(n^2) small)."""
    n = len(values)
    idx = list(range(n))
    if n > 400:
        stride = math.ceil(n / 400)
        idx = idx[::stride]
    slopes = [(values[j] - values[i]) / (j - i) for a, i in enumerate(idx) for j in idx[a + 1 :]]
    slope = median(slopes) if slopes else 0.0
    intercept = median(v - slope * i for i, v in enumerate(values))
    return slope, intercept


def least_squares(values: list[float]) -> tuple[float, float]:
    """Slope and r^2 of the ordinary least-squares line."""
    n = len(values)
    if n < 2:
        return 0.0, 0.0
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    sxy = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    syy = sum((v - mean_y) ** 2 for v in values)
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
    return slope, r2


def mann_kendall_z(values: list[float]) -> float:
    """Standardised Mann-Kendall trend statistic, with the correction for ties."""
    n = len(values)
    if n < 3:
        return 0.0
    s = sum((values[j] > values[i]) - (values[j] < values[i]) for i in range(n) for j in range(i + 1, n))
    ties = Counter(values)
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18
    if var <= 0 or s == 0:
        return 0.0
    return (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var)


def segments(values: list[float], count: int = SEGMENTS) -> list[tuple[float, float]]:
    """(low, high) of each consecutive segment: its 10th and 90th percentiles (nearest rank),
    so that one transient spike does not stand for the whole segment."""
    n = len(values)
    bounds = [round(k * n / count) for k in range(count + 1)]
    return [(_rank(values[a:b], 0.1), _rank(values[a:b], 0.9)) for a, b in pairwise(bounds) if b > a]


def _rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def decide(series: list[float], min_steps: int, floor: float = MIN_SLOPE_BYTES) -> LeakVerdict:
    """The leak verdict for the memory held at each profiled step boundary; `floor` is the
    smallest growth per step that counts (MIN_SLOPE_BYTES for exact tensor bytes,
    HOST_MIN_SLOPE_BYTES for the host memory)."""
    values = [float(v) for v in series]
    n = len(values)
    if n < max(min_steps, SEGMENTS * 2):
        short = _short_series(values, floor)
        if short is not None:
            return short
        needed = max(min_steps, SEGMENTS * 2)
        return _verdict(False, f"not enough steps to decide (only {n} of {needed} profiled steps after warm-up), and they do not all rise by the floor", values)
    slope, intercept = theil_sen(values)
    residuals = [v - (intercept + slope * i) for i, v in enumerate(values)]
    noise = 1.4826 * median(abs(r - median(residuals)) for r in residuals)
    parts = segments(values)
    seg_len = n / len(parts)
    rise_floor = max(floor, 0.25 * slope * seg_len)
    rising = all(b[0] - a[0] >= rise_floor and b[1] - a[1] >= rise_floor for a, b in pairwise(parts))
    if slope < floor:
        reason = f"no growth: {slope:.0f} bytes/step, under the {floor:.0f} bytes/step floor"
        return _verdict(False, reason, values, slope, noise, parts)
    if slope * (n - 1) < NOISE_FACTOR * noise:
        reason = f"growth of {slope * (n - 1):.0f} bytes is within {NOISE_FACTOR:.0f}x the noise ({noise:.0f} bytes)"
        return _verdict(False, reason, values, slope, noise, parts)
    if not rising:
        reason = "not steady: the segments' lows and highs do not both rise (a plateau, a bounded cycle or a one-off jump)"
        return _verdict(False, reason, values, slope, noise, parts)
    return _verdict(True, f"grows {slope:.0f} bytes/step, steadily, over {n} steps", values, slope, noise, parts)


def _short_series(values: list[float], floor: float) -> LeakVerdict | None:
    """Too few steps for the segment test, yet decisive: every step-to-step change is a rise
    of at least the floor, and the one-sided sign test over those changes (p = 0.5^changes)
    is under 0.05, so 6 steps (5 rises) decide."""
    diffs = [b - a for a, b in pairwise(values)]
    if not diffs or any(d < floor for d in diffs):
        return None
    test = sign_test(diffs, 0.0)
    if not test.decisive_above:
        return None
    reason = f"grows at every one of {len(diffs)} step-to-step changes, each at least {floor:.0f} bytes ({test.statement('rose')})"
    return _verdict(True, reason, values, noise=0.0)


def _verdict(leak: bool, reason: str, values: list[float], slope: float | None = None, noise: float = 0.0, parts: list[tuple[float, float]] | None = None) -> LeakVerdict:
    n = len(values)
    if slope is None:
        slope = theil_sen(values)[0] if n >= 2 else 0.0
    ls_slope, r2 = least_squares(values)
    diffs = [b - a for a, b in pairwise(values)]
    return LeakVerdict(
        leak=leak,
        reason=reason,
        steps=n,
        slope_bytes_per_step=slope,
        ls_slope_bytes_per_step=ls_slope,
        r2=r2,
        increasing_fraction=(sum(d > 0 for d in diffs) / len(diffs)) if diffs else 0.0,
        mann_kendall_z=mann_kendall_z(values),
        total_growth_bytes=(values[-1] - values[0]) if values else 0.0,
        start_bytes=values[0] if values else 0.0,
        noise_bytes=noise,
        segments=parts if parts is not None else (segments(values) if n >= SEGMENTS else []),
    )

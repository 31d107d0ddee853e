"""The spread of a timing ratio, so that no ratio is read as a measured difference when the
runs' own noise covers it.

`ratio_of_medians` takes the per-step times of two runs (the steps after warm-up) and gives
median(numerator) / median(denominator) with a 95 % percentile-bootstrap interval: each
resample draws both runs' steps with replacement and takes the ratio of their medians. A
fixed seed makes the interval repeat exactly for the same step times. `ratio_from_iqr` is
for when only a median and an IQR are known for each side (a baseline report): the interval
spans the ratio of the quartiles, numerator's against denominator's opposite ones.

"Within noise": the interval covers 1.0, so the data cannot tell the two runs apart.
Pure Python on purpose: the stage process has no reason to import numpy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from statistics import median
from traingate.stages.performance.details import SpreadRecord

RESAMPLES = 1000
CONFIDENCE = 0.95
SEED = 20260101


@dataclass(frozen=True)
class RatioSpread:
    ratio: float
    low: float
    high: float
    method: str

    @property
    def within_noise(self) -> bool:
        return self.low <= 1.0 <= self.high

    def record(self, digits: int | None = None) -> SpreadRecord:
        """The report's record; `digits` rounds the ratio and its bounds."""
        ratio, low, high = (self.ratio, self.low, self.high) if digits is None else (round(self.ratio, digits), round(self.low, digits), round(self.high, digits))
        return SpreadRecord(ratio=ratio, low=low, high=high, within_noise=self.within_noise, method=self.method)

    def describe(self, unit: str = "x") -> str:
        """`2.10x (95 % interval 1.95–2.30x)`, with `, within noise` when it covers 1."""
        text = f"{self.ratio:.2f}{unit} (95 % interval {self.low:.2f}–{self.high:.2f}{unit}"
        return text + (", within noise)" if self.within_noise else ")")


def ratio_of_medians(numerator: list[float], denominator: list[float], resamples: int = RESAMPLES, seed: int = SEED) -> RatioSpread | None:
    """median(numerator) / median(denominator) and its bootstrap interval; None when a side
    has no steps or a median of zero."""
    return ratio_of_quantiles(numerator, denominator, 0.5, resamples, seed)


def ratio_of_quantiles(numerator: list[float], denominator: list[float], q: float, resamples: int = RESAMPLES, seed: int = SEED) -> RatioSpread | None:
    """The ratio of both sides' `q` quantiles (0.5: the medians) and its bootstrap interval;
    None when a side has no steps or a quantile of zero."""
    if not numerator or not denominator:
        return None
    bottom = quantile(denominator, q)
    if bottom <= 0:
        return None
    ratio = quantile(numerator, q) / bottom
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        top = quantile(rng.choices(numerator, k=len(numerator)), q)
        under = quantile(rng.choices(denominator, k=len(denominator)), q)
        if under > 0:
            ratios.append(top / under)
    if not ratios:
        return RatioSpread(ratio, ratio, ratio, "bootstrap")
    ratios.sort()
    tail = (1 - CONFIDENCE) / 2
    low = ratios[int(tail * (len(ratios) - 1))]
    high = ratios[int(round((1 - tail) * (len(ratios) - 1)))]
    what = "medians" if q == 0.5 else f"{q:.0%} quantiles"
    method = f"bootstrap over steps, {resamples} resamples" + ("" if q == 0.5 else f", {what}")
    return RatioSpread(ratio, min(low, ratio), max(high, ratio), method)


def quantile(values: list[float], q: float) -> float:
    """The `q` quantile, linearly interpolated between the sorted values (q = 0.5: the median)."""
    if q == 0.5:
        return median(values)
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def ratio_from_iqr(numerator_median: float, numerator_iqr: float, denominator_median: float, denominator_iqr: float) -> RatioSpread | None:
    """The ratio of two medians with the interval their interquartile ranges allow: from
    the numerator's lower quartile over the denominator's upper one to the other way round
    (quartiles taken as median -/+ IQR/2)."""
    if denominator_median <= 0:
        return None
    ratio = numerator_median / denominator_median
    low_den = denominator_median - denominator_iqr / 2
    low = max(0.0, numerator_median - numerator_iqr / 2) / (denominator_median + denominator_iqr / 2)
    # A denominator whose spread reaches zero bounds nothing: cap it at a thousandth of its median.
    high = (numerator_median + numerator_iqr / 2) / max(low_den, denominator_median * 1e-3)
    return RatioSpread(ratio, low, high, "interquartile ranges")

"""A one-sided sign test for per-step verdicts on few steps.

Each profiled step is one observation: above the threshold or not. Under the null
hypothesis (the typical step is at the threshold) each is above with probability 1/2, so
`k` of `n` steps above has p = P(X >= k), X ~ Binomial(n, 1/2). Every one of 5 steps above
gives p = 0.5^5 = 0.031: decisive at p < 0.05, where a fixed minimum step count would not
decide at all."""

from __future__ import annotations

import math
from dataclasses import dataclass
from traingate.stages.performance.details import SignTestRecord

DECISIVE_P = 0.05


@dataclass(frozen=True)
class SignTest:
    above: int
    steps: int
    p_value: float  # one-sided: the steps lie above the threshold
    p_below: float  # one-sided: the steps lie below it

    @property
    def decisive_above(self) -> bool:
        return self.steps > 0 and self.p_value < DECISIVE_P

    @property
    def decisive_below(self) -> bool:
        return self.steps > 0 and self.p_below < DECISIVE_P

    def statement(self, what: str) -> str:
        return f"one-sided sign test: {self.above} of {self.steps} steps {what}, p = {self.p_value:.3g} (decisive at p < {DECISIVE_P})"

    def record(self, what: str) -> SignTestRecord:
        return SignTestRecord(test="one-sided sign test", above=self.above, steps=self.steps, p_value=round(self.p_value, 6), p_below=round(self.p_below, 6), alpha=DECISIVE_P, statement=self.statement(what))


def sign_test(values: list[float], threshold: float) -> SignTest:
    """Steps above `threshold` against steps below it (steps equal to it are left out)."""
    above = sum(v > threshold for v in values)
    below = sum(v < threshold for v in values)
    n = above + below
    return SignTest(above, n, _tail(above, n), _tail(below, n))


def _tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2)."""
    if n == 0:
        return 1.0
    return float(sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n)

"""The leak statistics on synthetic series: no processes, no torch."""

from __future__ import annotations

import random

import pytest

from traingate.stages.performance.leak import MIN_SLOPE_BYTES, decide, least_squares, mann_kendall_z, theil_sen
from traingate.stages.performance.memory import severity_for

BASE = 5_000_000.0
MIN_STEPS = 8


def noisy(values: list[float], sigma: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [v + rng.gauss(0, sigma) for v in values]


def test_flat_with_noise_is_not_a_leak() -> None:
    verdict = decide(noisy([BASE] * 50, sigma=4096), MIN_STEPS)
    assert not verdict.leak
    assert abs(verdict.slope_bytes_per_step) < 1024


def test_plateau_after_the_first_step_is_not_a_leak() -> None:
    # Optimizer state appears at step 1 and stays: one jump, then flat.
    series = [BASE] + [BASE + 3_000_000] * 49
    verdict = decide(series, MIN_STEPS)
    assert not verdict.leak
    assert verdict.slope_bytes_per_step == 0


def test_steady_growth_is_a_leak_with_its_numbers() -> None:
    series = noisy([BASE + 32_768 * i for i in range(40)], sigma=2048)
    verdict = decide(series, MIN_STEPS)
    assert verdict.leak
    assert verdict.slope_bytes_per_step == pytest.approx(32_768, rel=0.05)
    assert verdict.r2 > 0.99
    assert verdict.total_growth_bytes == pytest.approx(32_768 * 39, rel=0.1)
    assert verdict.steps == 40
    assert verdict.mann_kendall_z > 5


def test_small_exact_growth_is_a_leak() -> None:
    # 256 bytes a step, measured to the byte (a kept loss tensor): above the floor.
    verdict = decide([BASE + 256 * i for i in range(37)], MIN_STEPS)
    assert verdict.leak
    assert verdict.increasing_fraction == 1.0


def test_growth_under_the_floor_is_not_a_leak() -> None:
    verdict = decide([BASE + 8 * i for i in range(40)], MIN_STEPS)
    assert not verdict.leak
    assert verdict.slope_bytes_per_step < MIN_SLOPE_BYTES


def test_bounded_sawtooth_is_not_a_leak() -> None:
    # A per-epoch list: grows for 10 steps, is cleared, grows again.
    series = [BASE + 65_536 * (i % 10) for i in range(40)]
    verdict = decide(series, MIN_STEPS)
    assert not verdict.leak
    # Every segment spans a whole cycle: its low and high stay within one step of the cycle.
    lows, highs = [low for low, _ in verdict.segments], [high for _, high in verdict.segments]
    assert max(lows) - min(lows) <= 65_536 and max(highs) - min(highs) <= 65_536


def test_long_period_sawtooth_is_not_a_leak() -> None:
    series = [BASE + 65_536 * (i % 20) for i in range(40)]
    assert not decide(series, MIN_STEPS).leak


def test_one_off_jump_in_the_middle_is_not_a_leak() -> None:
    series = noisy([BASE] * 20 + [BASE + 8_000_000] * 20, sigma=512)
    verdict = decide(series, MIN_STEPS)
    assert not verdict.leak


def test_a_cache_filling_to_its_bound_is_not_a_leak() -> None:
    # deque(maxlen=8): grows for 8 steps, then holds steady.
    series = [BASE + 65_536 * min(i, 8) for i in range(37)]
    assert not decide(series, MIN_STEPS).leak


def test_growth_hidden_in_large_noise_is_not_claimed() -> None:
    series = noisy([BASE + 200 * i for i in range(40)], sigma=200_000, seed=3)
    assert not decide(series, MIN_STEPS).leak


def test_too_few_steps_are_not_decided() -> None:
    verdict = decide([BASE + 1_000_000 * i for i in range(5)], MIN_STEPS)
    assert not verdict.leak
    assert "only 5" in verdict.reason


def test_severity_grows_with_steadiness_and_size() -> None:
    large = decide([BASE + 500_000 * i for i in range(40)], MIN_STEPS)
    small = decide([BASE + 256 * i for i in range(40)], MIN_STEPS)
    assert severity_for(large, graph=False).value == "high"
    assert severity_for(small, graph=False).value == "medium"
    # A kept autograd graph costs more than its bytes show.
    assert severity_for(small, graph=True).value == "high"


def test_estimators_on_exact_lines() -> None:
    line = [3.0 + 2.0 * i for i in range(10)]
    assert theil_sen(line) == (2.0, 3.0)
    slope, r2 = least_squares(line)
    assert slope == pytest.approx(2.0) and r2 == pytest.approx(1.0)
    assert mann_kendall_z(line) > 3
    assert mann_kendall_z(line[::-1]) < -3
    assert mann_kendall_z([1.0] * 10) == 0.0


def test_one_transient_spike_does_not_hide_a_steady_leak() -> None:
    series = [BASE + 512 * i for i in range(40)]
    series[20] += 200_000  # one boundary where a transient was still alive
    assert decide(series, MIN_STEPS).leak

"""The anytime-valid leak-rate test: its error bound holds under continuous monitoring.

The simulations use a fixed seed, so they are deterministic; the bounds asserted are the
test's guarantee (alpha), with the sampling error of the finite number of runs allowed for.
"""

from __future__ import annotations

import math
import random

import pytest

from dsv4_operator.guard.sequential import LeakRateTest, Sequential
from dsv4_operator.leak.stats import wilson_interval


def _monitor(
    test: LeakRateTest, rate: float, looks: int, per_look: int, rng: random.Random
) -> Sequential:
    """Look after every `per_look` responses, `looks` times; the first decision, if any."""
    leaks = samples = 0
    for _ in range(looks):
        samples += per_look
        leaks += sum(rng.random() < rate for _ in range(per_look))
        verdict = test.decide(leaks, samples)
        if verdict is not Sequential.UNDECIDED:
            return verdict
    return Sequential.UNDECIDED


def test_at_the_threshold_it_rarely_ever_says_above_however_often_it_looks() -> None:
    test = LeakRateTest(threshold=0.02, alpha=0.05)
    rng = random.Random(20261201)
    runs = 400
    above = sum(
        _monitor(test, 0.02, looks=200, per_look=10, rng=rng) is Sequential.ABOVE
        for _ in range(runs)
    )
    # P(ever Above) <= alpha = 5%; 400 runs: allow three standard errors.
    assert above / runs <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)


def test_repeated_wilson_looks_at_the_same_data_cross_far_more_often() -> None:
    """What the test replaces: the same looks with a one-sided 95% Wilson bound."""
    rng = random.Random(20261201)
    runs, crossed = 400, 0
    for _ in range(runs):
        leaks = samples = 0
        for _ in range(200):
            samples += 10
            leaks += sum(rng.random() < 0.02 for _ in range(10))
            if samples >= 40 and wilson_interval(leaks, samples, 0.90)[0] > 0.02:
                crossed += 1
                break
    assert crossed / runs > 0.10  # repeated looks inflate a nominal 5% well beyond it


@pytest.mark.parametrize(("rate", "verdict"), [(0.17, Sequential.ABOVE), (0.001, Sequential.BELOW)])
def test_clear_rates_are_decided(rate: float, verdict: Sequential) -> None:
    test = LeakRateTest(threshold=0.02, alpha=0.05)
    rng = random.Random(7)
    assert _monitor(test, rate, looks=100, per_look=100, rng=rng) is verdict


def test_evidence_grows_with_leaks_and_shrinks_with_clean_responses() -> None:
    test = LeakRateTest(threshold=0.02, alpha=0.05)
    assert test.log_evidence_above(10, 100) > test.log_evidence_above(2, 100)
    assert test.log_evidence_below(0, 1000) > test.log_evidence_below(0, 100)
    assert test.decide(0, 0) is Sequential.UNDECIDED


def test_bad_parameters_and_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="threshold"):
        LeakRateTest(threshold=0.0, alpha=0.05)
    with pytest.raises(ValueError, match="alpha"):
        LeakRateTest(threshold=0.02, alpha=1.0)
    with pytest.raises(ValueError, match="leaks"):
        LeakRateTest(threshold=0.02, alpha=0.05).decide(5, 3)

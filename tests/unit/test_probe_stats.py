"""Leak statistics: Wilson interval, Fisher's exact test, percentiles, against known values."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsv4_operator.leak.stats import (
    compare_proportions,
    fisher_exact,
    percentile,
    significantly_above,
    wilson_interval,
)

# (successes, trials, confidence) -> (low, high), from published tables / Wikipedia's example
# (81 of 263 at 95%: 0.2553 to 0.3662) and R's prop.test(correct=FALSE)$conf.int.
KNOWN_WILSON = [
    ((0, 10, 0.95), (0.0, 0.2775)),
    ((1, 10, 0.95), (0.0179, 0.4042)),
    ((5, 10, 0.95), (0.2366, 0.7634)),
    ((81, 263, 0.95), (0.2553, 0.3662)),
    ((10, 10, 0.95), (0.7225, 1.0)),
]


@pytest.mark.parametrize(("args", "expected"), KNOWN_WILSON)
def test_wilson_known_values(args: tuple[int, int, float], expected: tuple[float, float]) -> None:
    low, high = wilson_interval(*args)
    assert low == pytest.approx(expected[0], abs=5e-5)
    assert high == pytest.approx(expected[1], abs=5e-5)


def test_wilson_no_trials_is_uninformative() -> None:
    assert wilson_interval(0, 0, 0.99) == (0.0, 1.0)


@pytest.mark.parametrize("bad", [(-1, 10, 0.9), (11, 10, 0.9), (1, 10, 0.0), (1, 10, 1.0)])
def test_wilson_rejects_bad_input(bad: tuple[int, int, float]) -> None:
    with pytest.raises(ValueError):
        wilson_interval(*bad)


def _closed_form(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson bounds as the roots of (p - k/n)^2 = z^2 p (1 - p) / n (an independent route)."""
    a = 1 + z * z / n
    b = -(2 * k / n + z * z / n)
    c = (k / n) ** 2
    disc = math.sqrt(max(0.0, b * b - 4 * a * c))
    return (-b - disc) / (2 * a), (-b + disc) / (2 * a)


@given(
    n=st.integers(1, 2000),
    data=st.data(),
    confidence=st.sampled_from([0.8, 0.9, 0.95, 0.99, 0.999]),
)
def test_wilson_properties(n: int, data: st.DataObject, confidence: float) -> None:
    k = data.draw(st.integers(0, n))
    low, high = wilson_interval(k, n, confidence)
    assert 0.0 <= low <= k / n <= high <= 1.0
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    root_low, root_high = _closed_form(k, n, z)
    assert low == pytest.approx(max(0.0, root_low), abs=1e-9)
    assert high == pytest.approx(min(1.0, root_high), abs=1e-9)
    # Symmetry: failures are successes seen from the other side.
    mirror_low, mirror_high = wilson_interval(n - k, n, confidence)
    assert low == pytest.approx(1 - mirror_high, abs=1e-9)
    assert high == pytest.approx(1 - mirror_low, abs=1e-9)
    # More confidence, wider interval.
    wide_low, wide_high = wilson_interval(k, n, min(0.9999, confidence + 0.0009))
    assert wide_low <= low + 1e-12 and wide_high >= high - 1e-12


def test_significantly_above_uses_the_lower_bound() -> None:
    # 10 of 60 sessions at 99%: lower bound ~6.4%, above 2% but not above 10%.
    assert significantly_above(10, 60, 0.02, 0.99)
    assert not significantly_above(10, 60, 0.10, 0.99)
    assert not significantly_above(0, 1000, 0.0, 0.99)


# Fisher's exact test: the "lady tasting tea" table (p = 17/35) and scipy's documented examples.
KNOWN_FISHER = [
    ((3, 4, 1, 4), 17 / 35),
    ((8, 10, 1, 6), 0.034965034965034919),
    ((6, 8, 1, 5), 0.10256410256410256),
    ((0, 5, 0, 5), 1.0),
]


@pytest.mark.parametrize(("table", "expected"), KNOWN_FISHER)
def test_fisher_known_values(table: tuple[int, int, int, int], expected: float) -> None:
    assert fisher_exact(*table) == pytest.approx(expected, rel=1e-9)


def _fisher_by_enumeration(k1: int, n1: int, k2: int, n2: int) -> Fraction:
    """Exact rational two-sided p-value by enumerating every table with the same margins."""
    successes = k1 + k2
    total = math.comb(n1 + n2, successes)
    probs = {
        x: Fraction(math.comb(n1, x) * math.comb(n2, successes - x), total)
        for x in range(max(0, successes - n2), min(successes, n1) + 1)
    }
    return sum((p for p in probs.values() if p <= probs[k1]), Fraction(0))


@given(
    n1=st.integers(1, 40),
    n2=st.integers(1, 40),
    data=st.data(),
)
def test_fisher_matches_exact_enumeration(n1: int, n2: int, data: st.DataObject) -> None:
    k1 = data.draw(st.integers(0, n1))
    k2 = data.draw(st.integers(0, n2))
    p = fisher_exact(k1, n1, k2, n2)
    assert p == pytest.approx(float(_fisher_by_enumeration(k1, n1, k2, n2)), rel=1e-6, abs=1e-12)
    assert p == pytest.approx(fisher_exact(k2, n2, k1, n1), rel=1e-9)  # group order is irrelevant
    assert 0.0 < p <= 1.0


def test_compare_proportions_seed_figures() -> None:
    # The incident's A/B: bf16 10/60 sessions corrupted vs fp8 0/60.
    test = compare_proportions(10, 60, 0, 60, confidence=0.99)
    assert test.significant and test.p_value < 0.01
    assert test.rate1 == pytest.approx(10 / 60) and test.rate2 == 0.0
    assert test.difference == pytest.approx(10 / 60)
    close = compare_proportions(2, 60, 1, 60, confidence=0.99)
    assert not close.significant


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=2, max_size=60), st.integers(1, 99))
def test_percentile_matches_statistics_inclusive(values: list[float], q: int) -> None:
    expected = statistics.quantiles(values, n=100, method="inclusive")[q - 1]
    assert percentile(values, q) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_percentile_edges() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)

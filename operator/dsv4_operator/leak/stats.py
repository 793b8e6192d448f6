"""Leak-rate statistics: Wilson score interval and Fisher's exact test for two proportions.

Shared by the guard policy and the canary (`dsv4 probe`), so it belongs to neither.

Pure functions, no scipy. Fisher's exact test is used for `dsv4 probe --vs` because canary
counts are small (tens of leaks in hundreds of responses), where a normal approximation is
poor; its two-sided p-value sums the probabilities of all tables at most as likely as the
observed one (the convention of R's `fisher.test` and scipy's `fisher_exact`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

# Tables whose probability is within this relative tolerance of the observed one count as
# "at most as likely" (guards against floating-point ties; R uses 1 + 1e-7 as well).
_RELATIVE_TIE = 1 + 1e-7


def confidence_text(confidence: float) -> str:
    """A confidence as a percentage with the digits it has: 0.999 is "99.9%", never "100%"."""
    return f"{100 * confidence:.10g}%"


def _check_counts(successes: int, trials: int) -> None:
    if trials < 0 or successes < 0 or successes > trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Wilson score interval for `successes` of `trials` at `confidence`.

    No trials gives (0, 1): no evidence either way.
    """
    _check_counts(successes, trials)
    _check_confidence(confidence)
    if trials == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    z2 = z * z
    denominator = 1 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test: is k1/n1 different from k2/n2?

    The 2x2 table is [[k1, n1 - k1], [k2, n2 - k2]] with fixed margins; the count in the first
    cell is hypergeometric under the null hypothesis of equal proportions.
    """
    _check_counts(k1, n1)
    _check_counts(k2, n2)
    total, successes = n1 + n2, k1 + k2
    if n1 == 0 or n2 == 0 or successes == 0 or successes == total:
        return 1.0
    low, high = max(0, successes - n2), min(successes, n1)
    denominator = _log_comb(total, successes)

    def log_p(x: int) -> float:
        return _log_comb(n1, x) + _log_comb(n2, successes - x) - denominator

    observed = log_p(k1)
    threshold = observed + math.log(_RELATIVE_TIE)
    p = sum(math.exp(v) for v in (log_p(x) for x in range(low, high + 1)) if v <= threshold)
    return min(1.0, p)


@dataclass(frozen=True)
class ProportionTest:
    """Two observed proportions and whether they differ significantly (Fisher's exact test)."""

    k1: int
    n1: int
    k2: int
    n2: int
    p_value: float
    alpha: float

    @property
    def rate1(self) -> float:
        return self.k1 / self.n1 if self.n1 else 0.0

    @property
    def rate2(self) -> float:
        return self.k2 / self.n2 if self.n2 else 0.0

    @property
    def difference(self) -> float:
        return self.rate1 - self.rate2

    @property
    def significant(self) -> bool:
        return self.p_value < self.alpha

    def as_dict(self) -> dict[str, float | int | bool]:
        return {
            "k1": self.k1,
            "n1": self.n1,
            "k2": self.k2,
            "n2": self.n2,
            "rate1": self.rate1,
            "rate2": self.rate2,
            "difference": self.difference,
            "pValue": self.p_value,
            "alpha": self.alpha,
            "significant": self.significant,
        }


def compare_proportions(
    k1: int, n1: int, k2: int, n2: int, *, confidence: float = 0.95
) -> ProportionTest:
    """Fisher's exact test of k1/n1 against k2/n2 at significance level 1 - confidence."""
    _check_confidence(confidence)
    return ProportionTest(k1, n1, k2, n2, fisher_exact(k1, n1, k2, n2), 1 - confidence)


def significantly_above(successes: int, trials: int, threshold: float, confidence: float) -> bool:
    """True when the Wilson lower bound of the rate exceeds `threshold`."""
    return wilson_interval(successes, trials, confidence)[0] > threshold


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default method); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

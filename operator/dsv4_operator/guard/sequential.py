"""An anytime-valid test of a leak rate against a threshold: a mixture SPRT (pure).

Repeated Wilson looks at a growing window inflate false alarms: every look is another chance
to cross. A test martingale does not: under any leak rate p <= threshold, the mixture
likelihood ratio

    M_n = sum_j w_j * (q_j / t)^leaks * ((1 - q_j) / (1 - t))^(samples - leaks),  q_j > t,

has expectation <= 1 after every response (each factor's mean is <= 1 when p <= t <= q_j),
so by Ville's inequality the chance that it EVER reaches 1/alpha, however often it is looked
at, is at most alpha. "Above" is declared when it does; "below" by the mirror test with
alternatives q_j < t. The alternatives are a geometric grid around the threshold with equal
weights (a discrete mixture needs no special functions and costs O(grid) per look).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

# Grid ratio and reach: alternatives t*r^j (and t/r^j) out to a rate of 0.5 (and t/20).
GRID_RATIO = 1.5
HIGHEST_ALTERNATIVE = 0.5
LOWEST_ALTERNATIVE_FACTOR = 20.0


class Sequential(StrEnum):
    ABOVE = "Above"
    BELOW = "Below"
    UNDECIDED = "Undecided"


def _grid(threshold: float, upward: bool) -> tuple[float, ...]:
    out: list[float] = []
    q = threshold
    while True:
        q = q * GRID_RATIO if upward else q / GRID_RATIO
        if upward and q > max(HIGHEST_ALTERNATIVE, threshold * GRID_RATIO):
            break
        if not upward and q < threshold / LOWEST_ALTERNATIVE_FACTOR:
            break
        out.append(min(q, 1 - 1e-9))
    return tuple(out)


def _log_mixture(terms: list[float]) -> float:
    top = max(terms)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(t - top) for t in terms))


@dataclass(frozen=True)
class LeakRateTest:
    """Anytime-valid: P(ever Above | p <= threshold) <= alpha, P(ever Below | p >= threshold)
    <= alpha, whatever the number of looks."""

    threshold: float
    alpha: float
    above: tuple[float, ...] = field(init=False)
    below: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(f"threshold {self.threshold} must be in (0, 1)")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha {self.alpha} must be in (0, 1)")
        object.__setattr__(self, "above", _grid(self.threshold, upward=True))
        object.__setattr__(self, "below", _grid(self.threshold, upward=False))

    def _log_evidence(self, alternatives: tuple[float, ...], leaks: int, samples: int) -> float:
        t, clean = self.threshold, samples - leaks
        terms = [
            leaks * math.log(q / t) + clean * math.log((1 - q) / (1 - t)) for q in alternatives
        ]
        return _log_mixture(terms) - math.log(len(alternatives))

    def log_evidence_above(self, leaks: int, samples: int) -> float:
        """log M_n against `p <= threshold` (reaches log(1/alpha): Above)."""
        return self._log_evidence(self.above, leaks, samples)

    def log_evidence_below(self, leaks: int, samples: int) -> float:
        """log M_n against `p >= threshold` (reaches log(1/alpha): Below)."""
        return self._log_evidence(self.below, leaks, samples)

    def decide(self, leaks: int, samples: int) -> Sequential:
        if not 0 <= leaks <= samples:
            raise ValueError(f"need 0 <= leaks ({leaks}) <= samples ({samples})")
        bar = math.log(1 / self.alpha)
        if self.log_evidence_above(leaks, samples) >= bar:
            return Sequential.ABOVE
        if self.log_evidence_below(leaks, samples) >= bar:
            return Sequential.BELOW
        return Sequential.UNDECIDED

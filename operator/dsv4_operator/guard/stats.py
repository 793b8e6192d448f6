"""Wilson score interval: the statistical evidence behind a leak-rate verdict."""

from __future__ import annotations

import math
from statistics import NormalDist


def wilson_interval(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Two-sided Wilson score interval for a proportion (0, 1 for no trials)."""
    if trials <= 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)

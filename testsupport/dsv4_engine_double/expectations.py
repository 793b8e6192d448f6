"""What tests may expect from the engine double, derived from its corruption curve.

The double's verdicts are a deterministic function of (seed, conversation, declared load), so a
test that runs a canary against it always gets the same counts. Tests still should not pin the
count a particular seed happens to give: they check it against the band the curve allows, so
that a change to the curve, to the load the double reads, or to the detector shows up as a
failure, and a harmless change of prompts does not.

Each canary session is a different conversation, hence an independent hash: the number of
sessions with a corrupted response is distributed like Binomial(sessions, q) with
`q = session_corruption_probability(config, load, rounds)`. `leak_band` is the central interval
of that distribution holding all but `tail` of its mass (on each side); a count outside it
means the double is not following its curve.
"""

from __future__ import annotations

import math

from dsv4_engine_double.config import DoubleConfig, session_corruption_probability

TAIL = 1e-4


def binomial_band(n: int, q: float, tail: float = TAIL) -> tuple[int, int]:
    """Smallest `low` and largest `high` with P(X < low) <= tail and P(X > high) <= tail."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be a probability, got {q}")
    pmf = [math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(n + 1)]
    below, low = 0.0, 0
    while low < n and below + pmf[low] <= tail:
        below += pmf[low]
        low += 1
    above, high = 0.0, n
    while high > 0 and above + pmf[high] <= tail:
        above += pmf[high]
        high -= 1
    return low, high


def leak_band(
    config: DoubleConfig, load: int, sessions: int, rounds: int, tail: float = TAIL
) -> tuple[int, int]:
    """The session-leak counts a `sessions` x `rounds` canary at declared `load` may show.

    At a load where the curve is 0 this is exactly (0, 0): a clean config or a light load must
    never leak, whatever the seed."""
    q = session_corruption_probability(config, config.capped(load), rounds)
    return binomial_band(sessions, q, tail)

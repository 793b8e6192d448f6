"""What tests may expect from the engine double, derived from its corruption curve.

The double's verdicts are a deterministic function of (seed, conversation, declared load), so a
test that runs a canary against it always gets the same counts. Tests still should not pin the
count a particular seed happens to give: they check it against the band the curve allows, so
that a change to the curve, to the load the double reads, or to the detector shows up as a
failure, and a harmless change of prompts does not.

A corrupted model output is not always a corrupted answer: 0.5.23's deepseek-recipe returns some
of them as well-formed calls (parsers.py), so a response's answer is corrupted with
`answer_corruption_probability(config, load)`, which on 0.5.16 is the curve itself. Each canary
session is a different conversation, hence an independent hash: the number of sessions with a
corrupted answer is distributed like Binomial(sessions, q) with
`q = 1 - (1 - answer_corruption_probability(config, load)) ** rounds`. `leak_band` is the
central interval of that distribution holding all but `tail` of its mass (on each side); a
count outside it means the double is not following its curve.
"""

from __future__ import annotations

import math

from dsv4_engine_double import outputs, parsers
from dsv4_engine_double.config import DoubleConfig, corruption_probability

TAIL = 1e-4


def answer_corruption_probability(config: DoubleConfig, load: float) -> float:
    """Per-response probability that `config`'s answer at (declared) `load` is corrupted: the
    curve, less the share of each fault's outputs the release answers with a well-formed call."""
    corrupt = corruption_probability(config, load)
    if corrupt == 0.0:
        return 0.0
    weights = config.fault_probabilities(load)
    total = sum(weights.values())
    return corrupt * sum(w / total * _corrupted_share(config, f) for f, w in weights.items())


def _corrupted_share(config: DoubleConfig, fault: str) -> float:
    answers = parsers.answers(config)
    table = outputs.FAULT_OUTPUTS[fault]
    drawn = sum(w for kind, w in table.items() if answers[kind] is not None) / sum(table.values())
    silent = sum(answers[kind] is not None for kind in outputs.SILENT_DROPS)
    share = config.silent_drop_share
    return share * silent / len(outputs.SILENT_DROPS) + (1 - share) * drawn


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
    per_response = answer_corruption_probability(config, config.capped(load))
    return binomial_band(sessions, 1 - (1 - per_response) ** rounds, tail)

"""bench/bisection.py at a small size: its tables have every row, every culprit is found
exactly, and noise alone blames nothing."""

from __future__ import annotations

import random
import re

from tests.support.benches import load_bench

bench = load_bench("bisection.py")
SETUP = bench.Setup(
    sessions=60, rounds=4, startup_min=20, batch_min=2, max_responses=2000, parallel=2, budget=60
)


def test_the_culprit_table_finds_single_and_pair_culprits_exactly() -> None:
    lines = bench.culprit_table(random.Random(1), runs=2, noise=0.005, s=SETUP)
    rows = lines[1:]
    assert len(rows) == len(bench.SIZES) * 2 * len(bench.RATES)
    for row in rows:
        n, kind, rate, exact, superset, wrong, none, probes = row.split()[:8]
        assert int(n) in bench.SIZES and kind in ("single", "pair") and rate in ("4.55%", "17.00%")
        assert (exact, superset, wrong, none) == ("100.0%", "0", "0", "0"), row
        assert int(float(probes)) >= 3  # reproduce, at least one split, confirm


def test_noise_alone_blames_nothing() -> None:
    lines = bench.noise_table(random.Random(2), runs=20, noise=0.005, s=SETUP)
    for row in lines[1:]:
        assert re.search(r"\s0 in 20\s", row), row


def test_leaks_are_binomial_on_average() -> None:
    rng = random.Random(3)
    draws = [bench.leaks_among(rng, 240, 0.0455) for _ in range(2000)]
    assert abs(sum(draws) / len(draws) - 240 * 0.0455) < 0.5
    assert bench.leaks_among(rng, 240, 0.0) == 0

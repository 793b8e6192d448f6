"""Benchmark of culprit bisection with the real search and the real sequential test.

(Named bisection.py: a bench/bisect.py would shadow the standard library's `bisect`, which
`random` imports, for every script run from bench/.)

Each probe configuration leaks independently per canary response: at `rate` when it applies
every culprit unit, else at the healthy `--noise` rate. A probe runs canary batches (`--sessions`
x `--rounds` responses every `--batch-min` minutes, after `--startup-min` minutes of engine
start) and feeds the growing counts to `bisect.outcome.judge` (the guard's anytime-valid test at
the 2% threshold, alpha 0.01) until it decides or `--max-responses` run out (inconclusive). The
probes `bisect.search.next_probes` asks for at once run side by side (`--parallel`); a wave
takes as long as its slowest probe. The control probe is off (the state machine's default); on,
it adds one probe beside the reproduction. Prints, per delta size (4, 8, 16 units), culprit (one
setting, a two-setting interaction) and leak rate (4.55%, 17%):

- how often the culprit was found exactly, how often a superset of it was named with
  `minimal: false` (`super`: a smaller set's probe was inconclusive, so it was skipped), how
  often a set without the culprit was blamed (`wrong`) and how often nothing was (`none`:
  budget, inconclusive or not reproduced); probes (median, p95) and simulated hours (median),
  also with one probe at a time (`1-at-once`);
- the lower bound: log2 of the number of candidate culprits (n singles, n(n-1)/2 pairs): any
  search of pass/fail answers needs that many probes on average, one at a time;

then how often noise alone produced a culprit: deltas with no culprit, every configuration at
the healthy rate and at the threshold itself (the hardest case for the test), in `--noise-runs`
seeded runs each (the goal: never).

    python bench/bisection.py [--runs 200] [--noise-runs 1000] [--seed 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dsv4_operator.bisect import search
from dsv4_operator.bisect.outcome import Outcome, ProbeJudge, judge

THRESHOLD, ALPHA = 0.02, 0.01  # spec.guard.leakRate.threshold and spec.guard.tap.alpha defaults
RATES = (0.0455, 0.17)  # the incident: HiCache plateau per response, bf16 + HiCache sessions
SIZES = (4, 8, 16)
# A probe configuration (its applied units) -> its true leak rate per response.
Rates = Callable[[frozenset[str]], float]


def leaks_among(rng: random.Random, responses: int, rate: float) -> int:
    """Leaks among `responses` independent responses, by geometric skips (O(responses x rate))."""
    if rate <= 0:
        return 0
    count, position = 0, 0
    log_clean = math.log1p(-rate)
    while True:
        position += int(math.log(1.0 - rng.random()) / log_clean) + 1
        if position > responses:
            return count
        count += 1


@dataclass(frozen=True)
class Setup:
    sessions: int
    rounds: int
    startup_min: float
    batch_min: float
    max_responses: int
    parallel: int
    budget: int


@dataclass(frozen=True)
class Run:
    answer: search.BisectAnswer
    probes: int
    minutes: float


def probe(rng: random.Random, rate: float, setup: Setup) -> tuple[Outcome, float]:
    """One probe at a true leak rate: its outcome and its minutes."""
    rule = ProbeJudge(threshold=THRESHOLD, alpha=ALPHA, max_responses=setup.max_responses)
    batch = setup.sessions * setup.rounds
    leaks = responses = batches = 0
    while True:
        batches += 1
        leaks += leaks_among(rng, batch, rate)
        responses += batch
        outcome, _ = judge(leaks, responses, rule)
        if outcome is not None:
            return outcome, setup.startup_min + batches * setup.batch_min


def bisect_run(rng: random.Random, units: Sequence[str], rate_of: Rates, s: Setup) -> Run:
    state = search.start(units, s.budget)
    minutes = 0.0
    while search.answer(state) is None:
        state, requests = search.next_probes(state, s.parallel)
        wave = 0.0
        for request in requests:
            outcome, took = probe(rng, rate_of(frozenset(request.units)), s)
            state = search.record(state, request.probe_id, outcome)
            wave = max(wave, took)
        minutes += wave
    answer = search.answer(state)
    assert answer is not None
    return Run(answer, state.started, minutes)


def leaks_with(culprit: frozenset[str], rate: float, noise: float) -> Rates:
    """A configuration leaks at `rate` when it applies every culprit unit, else at `noise`."""
    return lambda applied: rate if culprit <= applied else noise


def culprit_table(rng: random.Random, runs: int, noise: float, s: Setup) -> list[str]:
    one_at_a_time = dataclasses.replace(s, parallel=1)
    lines = [
        f"{'units':>5} {'culprit':<7} {'rate':>6} {'exact':>6} {'super':>5} {'wrong':>5} "
        f"{'none':>4} {'probes p50':>10} {'p95':>4} {'1-at-once':>9} {'bound':>5} {'hours p50':>9} "
        f"{'1-at-once':>9}"
    ]
    for n, size, rate in itertools.product(SIZES, (1, 2), RATES):
        units = [f"u{i}" for i in range(n)]
        exact = superset = wrong = 0
        probes, hours, serial_probes, serial_hours = [], [], [], []
        for _ in range(runs):
            culprit = frozenset(rng.sample(units, size))
            run = bisect_run(rng, units, leaks_with(culprit, rate, noise), s)
            blamed = frozenset(run.answer.culprit)
            exact += blamed == culprit
            # A superset is named when a smaller set's probe was inconclusive: flagged not minimal.
            superset += blamed > culprit and not run.answer.minimal
            wrong += bool(blamed) and blamed != culprit and not (blamed > culprit)
            probes.append(run.probes)
            hours.append(run.minutes / 60)
            serial = bisect_run(rng, units, leaks_with(culprit, rate, noise), one_at_a_time)
            serial_probes.append(serial.probes)
            serial_hours.append(serial.minutes / 60)
        bound = search.lower_bound(math.comb(n, size))
        p95 = sorted(probes)[max(0, math.ceil(0.95 * len(probes)) - 1)]
        lines.append(
            f"{n:>5} {'single' if size == 1 else 'pair':<7} {rate:>6.2%} {exact / runs:>6.1%} "
            f"{superset:>5} {wrong:>5} {runs - exact - superset - wrong:>4} "
            f"{statistics.median(probes):>10g} {p95:>4} "
            f"{statistics.median(serial_probes):>9g} {bound:>5.1f} "
            f"{statistics.median(hours):>9.1f} {statistics.median(serial_hours):>9.1f}"
        )
    return lines


def noise_table(rng: random.Random, runs: int, noise: float, s: Setup) -> list[str]:
    lines = [f"{'units':>5} {'every rate':>10} {'culprits blamed':>15} {'answers':<40}"]
    for n, rate in itertools.product(SIZES, (noise, THRESHOLD)):
        units = [f"u{i}" for i in range(n)]
        answers: dict[str, int] = {}
        blamed = 0
        for _ in range(runs):
            run = bisect_run(rng, units, leaks_with(frozenset(), rate, rate), s)
            blamed += bool(run.answer.culprit)
            answers[run.answer.reason.value] = answers.get(run.answer.reason.value, 0) + 1
        summary = ", ".join(f"{k} {v}" for k, v in sorted(answers.items()))
        lines.append(f"{n:>5} {rate:>10.2%} {blamed:>6} in {runs:<5} {summary}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="Runs per culprit row.")
    parser.add_argument("--noise-runs", type=int, default=1000, help="Runs per noise row.")
    parser.add_argument("--noise", type=float, default=0.005, help="Healthy leak rate.")
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--startup-min", type=float, default=20.0)
    parser.add_argument("--batch-min", type=float, default=2.0)
    parser.add_argument("--max-responses", type=int, default=2000)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    setup = Setup(
        args.sessions,
        args.rounds,
        args.startup_min,
        args.batch_min,
        args.max_responses,
        args.parallel,
        args.budget,
    )
    rng = random.Random(args.seed)
    print(
        f"bisect: threshold {THRESHOLD:.0%}, alpha {ALPHA}, healthy rate {args.noise:.1%}, "
        f"{args.sessions}x{args.rounds} responses per batch every {args.batch_min:g} min after "
        f"{args.startup_min:g} min of start, at most {args.max_responses} responses a probe, "
        f"{args.parallel} probes at once, budget {args.budget}, seed {args.seed}"
    )
    print(f"\nculprits ({args.runs} runs a row; bound = log2 of the candidate culprits)")
    print("\n".join(culprit_table(rng, args.runs, args.noise, setup)))
    print(f"\nno culprit: every configuration at one rate ({args.noise_runs} runs a row)")
    print("\n".join(noise_table(rng, args.noise_runs, args.noise, setup)))


if __name__ == "__main__":
    main()

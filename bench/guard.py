"""Benchmark of the guard policy with the real code: detection speed and false rollbacks.

Simulates canary runs (spec.guard.canary: `sessions` x `rounds` responses every `interval`)
whose responses leak independently at a given rate, feeds the growing window of one revision
to `dsv4_operator.guard.policy.evaluate` after every run, exactly as the operator does, and
prints:

- at a 17% leak rate (the incident's bf16 + HiCache bug) against the 2% threshold: canary
  responses and seconds from onset to the rollback decision (median and p95);
- at a healthy 0.5% rate: false rollbacks per 10,000 decisions (a decision = one evaluation
  after a canary run; a revision is watched for `--runs-per-revision` runs, then a new window).

Then production traffic under continuous monitoring (issue: the leak tap): `--rate-per-s`
tool-calling responses a second, a decision point every `--check-every` seconds, for the
current policy (repeated one-sided Wilson looks, `guard.policy`) and the anytime-valid
mixture SPRT (`guard.sequential.LeakRateTest`, alpha = 1 - confidence): time and responses
from onset to the rollback decision at 4.55% and 17%, and false rollbacks per 10,000
decision points at 0.5% (a revision watched for `--points-per-revision` points, then anew).

Last, the silent drop (a tool call SGLang's parser cannot read is dropped: the client gets
prose, HTTP 200, no `tool_calls`; docs/engine-notes.md#leak-shapes) at 4.55% of responses,
`--rate-per-s` tool-calling responses a second of `tool_choice: auto` production traffic: time
and production responses from onset to the rollback decision of the guard's whole policy chain
(`guard.policy.evaluate`), fed what each source sees of it. The canary (every
`canary.interval`) knows a call is due, so a drop is its `missing_call`; the tap (every
`tap.interval`) sees prose, an answer, so nothing; the engines' drop counter (every
`engine.interval`) counts every drop.

    python bench/guard.py [--trials 2000] [--decisions 200000] [--seed 7]
"""

from __future__ import annotations

import argparse
import bisect
import functools
import math
import random
import statistics
from collections.abc import Callable

from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.guard.policy import Evidence, evaluate
from dsv4_operator.guard.sequential import LeakRateTest, Sequential
from dsv4_operator.reasons import GuardResult

# (leaks, samples) -> roll back now?
Decider = Callable[[int, int], bool]


@functools.cache
def _binomial_cdf(responses: int, rate: float) -> list[float]:
    cdf, total = [], 0.0
    for k in range(responses + 1):
        total += math.comb(responses, k) * rate**k * (1 - rate) ** (responses - k)
        cdf.append(total)
    return cdf


def leaks_in_run(rng: random.Random, responses: int, rate: float) -> int:
    """Leaks among `responses` independent responses: one Binomial draw (inverse CDF)."""
    return min(bisect.bisect_left(_binomial_cdf(responses, rate), rng.random()), responses)


def _above(test: LeakRateTest, leaks: int, samples: int) -> bool:
    return test.decide(leaks, samples) is Sequential.ABOVE


def wilson_decider(guard: GuardSpec) -> Decider:
    """The guard's own policy (repeated one-sided Wilson looks at the growing window)."""

    def wilson(leaks: int, samples: int) -> bool:
        return evaluate(Evidence(samples=samples, leaks=leaks), guard).outcome == GuardResult.FAIL

    return wilson


def deciders(guard: GuardSpec) -> dict[str, Decider]:
    out: dict[str, Decider] = {
        f"Wilson looks, confidence {guard.leak_rate.confidence}": wilson_decider(guard)
    }
    for alpha in (0.01, 0.001):
        test = LeakRateTest(guard.leak_rate.threshold, alpha)
        out[f"mixture SPRT, alpha {alpha}"] = functools.partial(_above, test)
    return out


def detection(
    decide: Decider, rate: float, per_point: int, trials: int, rng: random.Random
) -> list[int]:
    """Responses from onset to the first decision point that rolls back."""
    out = []
    for _ in range(trials):
        samples = leaks = 0
        while True:
            samples += per_point
            leaks += leaks_in_run(rng, per_point, rate)
            if decide(leaks, samples):
                out.append(samples)
                break
    return out


def false_rollbacks(
    decide: Decider,
    rate: float,
    per_point: int,
    points: int,
    per_revision: int,
    rng: random.Random,
) -> int:
    fails = made = 0
    while made < points:
        samples = leaks = 0
        for _ in range(per_revision):
            samples += per_point
            leaks += leaks_in_run(rng, per_point, rate)
            made += 1
            if decide(leaks, samples):
                fails += 1
                break
            if made >= points:
                break
    return fails


def production(args: argparse.Namespace, guard: GuardSpec, rng: random.Random) -> None:
    per_point = round(args.rate_per_s * args.check_every)
    print(
        f"production traffic: {args.rate_per_s:g} tool-calling responses/s, a decision point "
        f"every {args.check_every:g}s ({per_point} responses), "
        f"{args.points_per_revision} points per revision"
    )
    for name, decide in deciders(guard).items():
        for rate in (0.0455, 0.17):
            responses = detection(decide, rate, per_point, args.trials, rng)
            seconds = [r / args.rate_per_s for r in responses]
            print(
                f"  {name}: {rate:.2%} leak rate: rollback after median "
                f"{statistics.median(seconds):.0f}s / {statistics.median(responses):.0f} "
                f"responses, p95 {p95(seconds):.0f}s ({args.trials} trials)"
            )
        # 0.5%: healthy; 2%: the threshold itself, the worst case a guarantee must cover.
        for rate in (0.005, 0.02):
            fails = false_rollbacks(
                decide, rate, per_point, args.points, args.points_per_revision, rng
            )
            windows = math.ceil(args.points / args.points_per_revision)
            print(
                f"  {name}: {rate:.1%} leak rate: {fails} false rollbacks in {args.points} "
                f"decision points = {fails * 10_000 / args.points:.2f} per 10,000 "
                f"({fails / windows:.2%} of {windows} revision windows)"
            )


def silent_drops(args: argparse.Namespace, guard: GuardSpec, rng: random.Random) -> None:
    """The table: rollback decision after a silent drop onset, by the sources the guard has."""
    rate, per_s = 0.0455, args.rate_per_s
    canary_every = round(guard.canary.interval.delta.total_seconds())
    tap_every = round(guard.tap.interval.delta.total_seconds())
    engine_every = round(guard.engine.interval.delta.total_seconds())
    step = math.gcd(canary_every, tap_every, engine_every)
    # The default canary of a decode engine without data parallelism (as main() prints it).
    per_canary = (guard.canary.sessions or guard.canary.sessions_per_rank) * guard.canary.rounds
    sources = {
        "canary alone": ("canary",),
        "canary + tap": ("canary", "tap"),
        "canary + engine counter + tap": ("canary", "engine", "tap"),
    }
    print(
        f"silent tool-call drops at {rate:.2%} of responses, {per_s:g} tool-calling responses/s "
        f"of tool_choice auto traffic (canary {per_canary} responses every {canary_every}s, tap "
        f"every {tap_every}s, engine counter every {engine_every}s; {args.trials} trials):"
    )
    print(f"  {'sources':<31} {'median s':>9} {'p95 s':>7} {'median responses':>17}")
    seed = rng.randrange(1 << 30)
    for name, used in sources.items():
        rng = random.Random(seed)  # each row sees the same canary draws
        seconds = []
        for _ in range(args.trials):
            canary, engine, tap, t = [0, 0], [0, 0], 0, 0
            while True:
                t += step
                if "canary" in used and t % canary_every == 0:
                    canary[0] += per_canary
                    canary[1] += leaks_in_run(rng, per_canary, rate)
                if "engine" in used and t % engine_every == 0:
                    engine[0] += round(per_s * engine_every)
                    engine[1] += leaks_in_run(rng, round(per_s * engine_every), rate)
                if "tap" in used and t % tap_every == 0:
                    tap += round(per_s * tap_every)  # prose to the tap: an answer, no leak
                evidence = Evidence(
                    samples=canary[0],
                    leaks=canary[1],
                    traffic_samples=tap,
                    engine_samples=engine[0],
                    engine_leaks=engine[1],
                )
                if evaluate(evidence, guard).outcome == GuardResult.FAIL:
                    seconds.append(float(t))
                    break
        responses = statistics.median(seconds) * per_s
        print(
            f"  {name:<31} {statistics.median(seconds):>9.0f} {p95(seconds):>7.0f} "
            f"{responses:>17.0f}"
        )


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--runs-per-revision", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rate-per-s", type=float, default=20.0)
    parser.add_argument("--check-every", type=float, default=5.0)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--points-per-revision", type=int, default=720)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    guard = GuardSpec()
    lr = guard.leak_rate
    # The default canary of a one-rank decode engine (engine/canary_load.py: DP 1 x per rank).
    sessions = guard.canary.sessions or guard.canary.sessions_per_rank
    print(
        f"defaults: threshold {lr.threshold}, minSamples {lr.min_samples}, confidence "
        f"{lr.confidence}, canary {sessions}x{guard.canary.rounds} every "
        f"{guard.canary.interval}"
    )
    wilson = wilson_decider(guard)
    per_run = sessions * guard.canary.rounds
    interval = guard.canary.interval.delta.total_seconds()
    # 17%: the figure; 4.55%: the engine double's per-response plateau, which is
    # what makes 17% of 4-round sessions leak (testsupport/dsv4_engine_double/config.py).
    for rate in (0.17, 0.0455):
        responses = detection(wilson, rate, per_run, args.trials, rng)
        seconds = [r / per_run * interval for r in responses]
        print(
            f"{rate:.2%} leak rate: responses to rollback decision median "
            f"{statistics.median(responses):.0f}, p95 {p95([float(r) for r in responses]):.0f}; "
            f"seconds from onset median {statistics.median(seconds):.0f}, p95 {p95(seconds):.0f}"
            f" ({args.trials} trials)"
        )
    cases = (
        (args.runs_per_revision, f"{args.runs_per_revision} runs per revision"),
        (1, "worst case, every decision on a fresh one-run window"),
    )
    for runs, label in cases:
        fails = false_rollbacks(wilson, 0.005, per_run, args.decisions, runs, rng)
        print(
            f"0.5% leak rate, {label}: {fails} false rollbacks in {args.decisions} decisions"
            f" = {fails * 10_000 / args.decisions:.2f} per 10,000 decisions"
        )
    production(args, guard, rng)
    silent_drops(args, guard, rng)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark of the guard policy with the real code: detection speed and false rollbacks.

Simulates canary runs (spec.guard.canary: `sessions` x `rounds` responses every `interval`)
whose responses leak independently at a given rate, feeds the growing window of one revision
to `dsv4_operator.guard.policy.evaluate` after every run, exactly as the operator does, and
prints:

- at a 17% leak rate (the seeds' bf16 + HiCache bug) against the 2% threshold: canary
  responses and seconds from onset to the rollback decision (median and p95);
- at a healthy 0.5% rate: false rollbacks per 10,000 decisions (a decision = one evaluation
  after a canary run; a revision is watched for `--runs-per-revision` runs, then a new window).

    python bench/guard.py [--trials 2000] [--decisions 200000] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import statistics

from dsv4_operator.api.base import parse_duration
from dsv4_operator.api.spec import GuardSpec
from dsv4_operator.guard.policy import Evidence, Outcome, evaluate


def leaks_in_run(rng: random.Random, responses: int, rate: float) -> int:
    return sum(rng.random() < rate for _ in range(responses))


def detection(
    guard: GuardSpec, rate: float, trials: int, rng: random.Random
) -> tuple[list[int], list[float]]:
    per_run = guard.canary.sessions * guard.canary.rounds
    interval = parse_duration(guard.canary.interval).total_seconds()
    responses, seconds = [], []
    for _ in range(trials):
        samples = leaks = runs = 0
        while True:
            runs += 1
            samples += per_run
            leaks += leaks_in_run(rng, per_run, rate)
            if evaluate(Evidence(samples=samples, leaks=leaks), guard).outcome == Outcome.FAIL:
                responses.append(samples)
                seconds.append(runs * interval)
                break
    return responses, seconds


def false_rollbacks(
    guard: GuardSpec, rate: float, decisions: int, runs_per_revision: int, rng: random.Random
) -> int:
    per_run = guard.canary.sessions * guard.canary.rounds
    fails = made = 0
    while made < decisions:
        samples = leaks = 0
        for _ in range(runs_per_revision):
            samples += per_run
            leaks += leaks_in_run(rng, per_run, rate)
            made += 1
            if evaluate(Evidence(samples=samples, leaks=leaks), guard).outcome == Outcome.FAIL:
                fails += 1
                break  # a rollback ends the revision's window
            if made >= decisions:
                break
    return fails


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--runs-per-revision", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    guard = GuardSpec()
    lr = guard.leak_rate
    print(
        f"defaults: threshold {lr.threshold}, minSamples {lr.min_samples}, confidence "
        f"{lr.confidence}, canary {guard.canary.sessions}x{guard.canary.rounds} every "
        f"{guard.canary.interval}"
    )
    # 17%: the figure; 4.55%: the engine double's per-response plateau, which is
    # what makes 17% of 4-round sessions leak (tests/engine_double/config.py).
    for rate in (0.17, 0.0455):
        responses, seconds = detection(guard, rate, args.trials, rng)
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
        fails = false_rollbacks(guard, 0.005, args.decisions, runs, rng)
        print(
            f"0.5% leak rate, {label}: {fails} false rollbacks in {args.decisions} decisions"
            f" = {fails * 10_000 / args.decisions:.2f} per 10,000 decisions"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

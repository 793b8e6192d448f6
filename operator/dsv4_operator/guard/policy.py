"""Guard policy (pure): evidence in, a verdict with (reason, message) out.

A chain of checks, cert-manager style: the first check that has something to say decides.
Fail needs statistical evidence: the Wilson lower bound of the leak rate above the threshold
with at least `minSamples` responses (one-sided, at `confidence`); Pass needs the upper bound
below it. Between the two the window is inconclusive (NoData) and keeps collecting, until
the window has been settled for bakeTime: then, with `noData: Fail`, NoData fails.
A failing check names its rollback reason itself (`RollbackReason`); every reason is in
reasons.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.guard.sequential import LeakRateTest, Sequential
from dsv4_operator.leak.stats import wilson_interval
from dsv4_operator.reasons import GuardReason, GuardResult, RollbackReason


@dataclass(frozen=True)
class Evidence:
    """What the signals saw for one revision in the current window."""

    samples: int = 0
    leaks: int = 0
    traffic_samples: int = 0  # production tool-calling responses the leak taps classified
    traffic_leaks: int = 0
    oom_events: int = 0
    baked: bool = False
    source_error: str | None = None
    prometheus_leak_rate: float | None = None
    prometheus_oom_events: float | None = None
    settled: bool = False  # every role runs the revision, rolled and ready
    window_age: timedelta | None = None  # how long the revision's window has been open


@dataclass(frozen=True)
class GuardVerdict:
    """The guard's judgement of one window; a Fail carries the reason to roll back for."""

    outcome: GuardResult
    reason: GuardReason
    message: str
    rollback_reason: RollbackReason | None = None


# One link of the chain: a verdict on the window's evidence, or None to pass it on.
EvidenceCheck = Callable[[Evidence, GuardSpec], GuardVerdict | None]


def leak_bounds(evidence: Evidence, guard: GuardSpec) -> tuple[float, float]:
    # One-sided bounds at `confidence` = two-sided interval at 2*confidence - 1.
    return wilson_interval(evidence.leaks, evidence.samples, 2 * guard.leak_rate.confidence - 1)


def _oom(evidence: Evidence, guard: GuardSpec) -> GuardVerdict | None:
    events = evidence.oom_events + int(evidence.prometheus_oom_events or 0)
    if events and not evidence.baked:
        return GuardVerdict(
            GuardResult.FAIL,
            GuardReason.OOM_BEFORE_BAKE,
            f"{events} OOM event(s) on a revision that has not baked yet",
            RollbackReason.OOM,
        )
    if events >= guard.oom.max_events:
        return GuardVerdict(
            GuardResult.FAIL,
            GuardReason.OOM_EVENTS,
            f"{events} OOM event(s) within {guard.oom.window} (limit {guard.oom.max_events})",
            RollbackReason.OOM,
        )
    return None


def _source_error(evidence: Evidence, guard: GuardSpec) -> GuardVerdict | None:
    if evidence.source_error:
        return GuardVerdict(GuardResult.ERROR, GuardReason.SOURCE_ERROR, evidence.source_error)
    return None


def _prometheus(evidence: Evidence, guard: GuardSpec) -> GuardVerdict | None:
    rate = evidence.prometheus_leak_rate
    if rate is not None and rate > guard.leak_rate.threshold:
        return GuardVerdict(
            GuardResult.FAIL,
            GuardReason.PROMETHEUS_LEAK_RATE,
            f"leak-rate query returned {rate:.4f} > threshold {guard.leak_rate.threshold}",
            RollbackReason.LEAK_RATE,
        )
    return None


def _traffic(evidence: Evidence, guard: GuardSpec) -> GuardVerdict | None:
    """Production traffic through the leak taps, judged by an anytime-valid test: it is looked
    at every few seconds, and however often it is, a revision at or below the threshold is
    rolled back with a chance of at most `tap.alpha` (Wilson bounds looked at that often
    would cross far more often: bench/guard.py)."""
    samples, leaks = evidence.traffic_samples, evidence.traffic_leaks
    if not guard.tap.enabled or samples == 0:
        return None
    threshold = guard.leak_rate.threshold
    test = LeakRateTest(threshold, guard.tap.alpha)
    if test.decide(leaks, samples) is not Sequential.ABOVE:
        return None
    return GuardVerdict(
        GuardResult.FAIL,
        GuardReason.TRAFFIC_LEAK_RATE,
        f"production traffic: {leaks}/{samples} tool-calling responses leaked "
        f"({leaks / samples:.1%}), above threshold {threshold:.1%} (anytime-valid test, "
        f"alpha {guard.tap.alpha})",
        RollbackReason.LEAK_RATE,
    )


def _leak_rate(evidence: Evidence, guard: GuardSpec) -> GuardVerdict | None:
    threshold = guard.leak_rate.threshold
    if evidence.samples < guard.leak_rate.min_samples:
        if evidence.prometheus_leak_rate is not None:
            return GuardVerdict(
                GuardResult.PASS,
                GuardReason.PROMETHEUS_LEAK_RATE,
                f"leak-rate query returned {evidence.prometheus_leak_rate:.4f} <= {threshold}",
            )
        return GuardVerdict(
            GuardResult.NO_DATA,
            GuardReason.TOO_FEW_SAMPLES,
            f"{evidence.samples} of {guard.leak_rate.min_samples} canary responses",
        )
    low, high = leak_bounds(evidence, guard)
    rate = evidence.leaks / evidence.samples
    observed = (
        f"{evidence.leaks}/{evidence.samples} responses leaked ({rate:.1%}, "
        f"{guard.leak_rate.confidence:.0%} bounds {low:.1%}-{high:.1%})"
    )
    if low > threshold:
        return GuardVerdict(
            GuardResult.FAIL,
            GuardReason.LEAK_RATE,
            f"{observed} above threshold {threshold:.1%}",
            RollbackReason.LEAK_RATE,
        )
    if high < threshold:
        return GuardVerdict(
            GuardResult.PASS, GuardReason.LEAK_RATE, f"{observed} below threshold {threshold:.1%}"
        )
    return GuardVerdict(
        GuardResult.NO_DATA, GuardReason.INCONCLUSIVE, f"{observed}: not yet conclusive"
    )


def _no_data_after_bake(evidence: Evidence, guard: GuardSpec) -> GuardVerdict | None:
    """`noData: Fail`: a settled window still inconclusive after bakeTime fails."""
    if (
        guard.no_data != "Fail"
        or not evidence.settled
        or evidence.window_age is None
        or evidence.window_age < guard.bake_time.delta
    ):
        return None
    verdict = _leak_rate(evidence, guard)
    if verdict is None or verdict.outcome != GuardResult.NO_DATA:
        return None
    return GuardVerdict(
        GuardResult.FAIL,
        GuardReason.NO_DATA,
        f"no conclusive canary evidence within bakeTime {guard.bake_time} "
        f"({verdict.message}); noData is Fail",
        RollbackReason.NO_DATA,
    )


CHECKS: tuple[EvidenceCheck, ...] = (
    _oom,
    _source_error,
    _prometheus,
    _traffic,
    _no_data_after_bake,
    _leak_rate,
)


def evaluate(evidence: Evidence, guard: GuardSpec) -> GuardVerdict:
    """The first check with something to say decides."""
    for check in CHECKS:
        verdict = check(evidence, guard)
        if verdict is not None:
            return verdict
    raise AssertionError("_leak_rate always returns a verdict")

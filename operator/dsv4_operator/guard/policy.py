"""Guard policy (pure): evidence in, a verdict with (reason, message) out.

A chain of checks, cert-manager style: the first check that has something to say decides.
Fail needs statistical evidence: the Wilson lower bound of the leak rate above the threshold
with at least `minSamples` responses (one-sided, at `confidence`); Pass needs the upper bound
below it. Between the two the window is inconclusive (NoData) and keeps collecting, until
the window has been settled for bakeTime: then, with `noData: Fail`, NoData fails.
Production traffic (the taps) and the engines' own counts are judged by an anytime-valid
sequential test instead (guard/sequential.py), since they are looked at every few seconds; so
are failed KV transfers, before the bake. A failing check names its rollback reason itself
(`RollbackReason`); every reason is in reasons.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.guard.sequential import LeakRateTest, Sequential
from dsv4_operator.leak.stats import confidence_text, wilson_interval
from dsv4_operator.reasons import GuardReason, GuardResult, RollbackReason


@dataclass(frozen=True)
class Evidence:
    """What the signals saw for one revision in the current window."""

    samples: int = 0
    leaks: int = 0
    traffic_samples: int = 0  # production tool-calling responses the leak taps classified
    traffic_leaks: int = 0
    # What the revision's engines counted: tool-calling responses their parser parsed and
    # those with a dropped call (decode); requests finished (decode), failed KV transfers.
    engine_samples: int = 0
    engine_leaks: int = 0
    kv_requests: int = 0
    kv_failures: int = 0
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


def _above(leaks: int, samples: int, threshold: float, alpha: float) -> bool:
    """The anytime-valid test says the rate is above `threshold` (guard/sequential.py)."""
    test = LeakRateTest(threshold, alpha)
    return test.decide(min(leaks, samples), samples) is Sequential.ABOVE


def _leaks_above(
    leaks: int, samples: int, observed: str, reason: GuardReason, alpha: float, guard: GuardSpec
) -> GuardVerdict | None:
    """A leak source looked at every few seconds: Fail when the anytime-valid test says its
    rate is above the threshold, else nothing to say."""
    threshold = guard.leak_rate.threshold
    if samples == 0 or not _above(leaks, samples, threshold, alpha):
        return None
    return GuardVerdict(
        GuardResult.FAIL,
        reason,
        f"{observed} ({leaks / samples:.1%}), above threshold {threshold:.1%} (anytime-valid "
        f"test, alpha {alpha})",
        RollbackReason.LEAK_RATE,
    )


def _traffic(evidence: Evidence, guard: GuardSpec) -> GuardVerdict | None:
    """Production traffic through the leak taps, judged by an anytime-valid test: it is looked
    at every few seconds, and however often it is, a revision at or below the threshold is
    rolled back with a chance of at most `tap.alpha` (Wilson bounds looked at that often
    would cross far more often: bench/guard.py)."""
    samples, leaks = evidence.traffic_samples, evidence.traffic_leaks
    if not guard.tap.enabled:
        return None
    observed = f"production traffic: {leaks}/{samples} tool-calling responses leaked"
    return _leaks_above(
        leaks, samples, observed, GuardReason.TRAFFIC_LEAK_RATE, guard.tap.alpha, guard
    )


def _engine_drops(evidence: Evidence, guard: GuardSpec) -> GuardVerdict | None:
    """The decode engines' own count of responses whose tool call their parser dropped (the
    client got prose, HTTP 200, no `tool_calls`): the same anytime-valid test as traffic."""
    samples, leaks = evidence.engine_samples, evidence.engine_leaks
    if not guard.engine.enabled:
        return None
    observed = f"engine: the parser dropped a tool call in {leaks}/{samples} tool-calling responses"
    return _leaks_above(
        leaks, samples, observed, GuardReason.ENGINE_TOOL_CALL_DROPS, guard.engine.alpha, guard
    )


def _kv_integrity(evidence: Evidence, guard: GuardSpec) -> GuardVerdict | None:
    """Failed prefill-to-decode KV transfers over the requests the decode engines finished,
    before the bake only (after it, the DSV4KVTransferFailures alert): at least
    `kvIntegrity.minRequests` requests, and the anytime-valid test above the threshold."""
    requests, failures = evidence.kv_requests, evidence.kv_failures
    kv = guard.kv_integrity
    if evidence.baked or not guard.engine.enabled or requests < kv.min_requests:
        return None
    if not _above(failures, requests, kv.threshold, guard.engine.alpha):
        return None
    return GuardVerdict(
        GuardResult.FAIL,
        GuardReason.KV_INTEGRITY,
        f"KV transfers: {failures} failed for {requests} requests the decode engines finished "
        f"({min(failures / requests, 1.0):.1%}) on a revision that has not baked, above "
        f"kvIntegrity.threshold {kv.threshold:.1%} (anytime-valid test, alpha "
        f"{guard.engine.alpha})",
        RollbackReason.KV_INTEGRITY,
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
        f"{confidence_text(guard.leak_rate.confidence)} bounds {low:.1%}-{high:.1%})"
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


# KV integrity before source errors: failed transfers answer HTTP 500, which the canary may
# see as its own failure; the cause must win over the symptom.
CHECKS: tuple[EvidenceCheck, ...] = (
    _oom,
    _kv_integrity,
    _source_error,
    _prometheus,
    _traffic,
    _engine_drops,
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

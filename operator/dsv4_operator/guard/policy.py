"""Guard policy (pure): evidence in, an outcome with (reason, message) out.

A chain of checks, cert-manager style: the first check that has something to say decides.
Fail needs statistical evidence: the Wilson lower bound of the leak rate above the threshold
with at least `minSamples` responses (one-sided, at `confidence`); Pass needs the upper bound
below it. Between the two the window is inconclusive (NoData) and keeps collecting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from dsv4_operator.api.spec import GuardSpec
from dsv4_operator.probe.stats import wilson_interval


class Outcome(StrEnum):
    PASS = "Pass"
    FAIL = "Fail"
    NO_DATA = "NoData"
    ERROR = "Error"


@dataclass(frozen=True)
class Evidence:
    """What the signals saw for one revision in the current window."""

    samples: int = 0
    leaks: int = 0
    oom_events: int = 0
    baked: bool = False
    source_error: str | None = None
    prometheus_leak_rate: float | None = None
    prometheus_oom_events: float | None = None


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str
    message: str

    @property
    def rollback_reason(self) -> str | None:
        """`LeakRate` or `OOM` when this verdict should roll back."""
        if self.outcome != Outcome.FAIL:
            return None
        return "OOM" if self.reason.startswith("OOM") else "LeakRate"


Check = Callable[[Evidence, GuardSpec], Verdict | None]


def leak_bounds(evidence: Evidence, guard: GuardSpec) -> tuple[float, float]:
    # One-sided bounds at `confidence` = two-sided interval at 2*confidence - 1.
    return wilson_interval(evidence.leaks, evidence.samples, 2 * guard.leak_rate.confidence - 1)


def _oom(evidence: Evidence, guard: GuardSpec) -> Verdict | None:
    events = evidence.oom_events + int(evidence.prometheus_oom_events or 0)
    if events and not evidence.baked:
        return Verdict(
            Outcome.FAIL,
            "OOMBeforeBake",
            f"{events} OOM event(s) on a revision that has not baked yet",
        )
    if events >= guard.oom.max_events:
        return Verdict(
            Outcome.FAIL,
            "OOMEvents",
            f"{events} OOM event(s) within {guard.oom.window} (limit {guard.oom.max_events})",
        )
    return None


def _source_error(evidence: Evidence, guard: GuardSpec) -> Verdict | None:
    if evidence.source_error:
        return Verdict(Outcome.ERROR, "SourceError", evidence.source_error)
    return None


def _prometheus(evidence: Evidence, guard: GuardSpec) -> Verdict | None:
    rate = evidence.prometheus_leak_rate
    if rate is not None and rate > guard.leak_rate.threshold:
        return Verdict(
            Outcome.FAIL,
            "PrometheusLeakRate",
            f"leak-rate query returned {rate:.4f} > threshold {guard.leak_rate.threshold}",
        )
    return None


def _leak_rate(evidence: Evidence, guard: GuardSpec) -> Verdict | None:
    threshold = guard.leak_rate.threshold
    if evidence.samples < guard.leak_rate.min_samples:
        if evidence.prometheus_leak_rate is not None:
            return Verdict(
                Outcome.PASS,
                "PrometheusLeakRate",
                f"leak-rate query returned {evidence.prometheus_leak_rate:.4f} <= {threshold}",
            )
        return Verdict(
            Outcome.NO_DATA,
            "TooFewSamples",
            f"{evidence.samples} of {guard.leak_rate.min_samples} canary responses",
        )
    low, high = leak_bounds(evidence, guard)
    rate = evidence.leaks / evidence.samples
    observed = (
        f"{evidence.leaks}/{evidence.samples} responses leaked ({rate:.1%}, "
        f"{guard.leak_rate.confidence:.0%} bounds {low:.1%}-{high:.1%})"
    )
    if low > threshold:
        return Verdict(Outcome.FAIL, "LeakRate", f"{observed} above threshold {threshold:.1%}")
    if high < threshold:
        return Verdict(Outcome.PASS, "LeakRate", f"{observed} below threshold {threshold:.1%}")
    return Verdict(Outcome.NO_DATA, "Inconclusive", f"{observed}: not yet conclusive")


CHECKS: tuple[Check, ...] = (_oom, _source_error, _prometheus, _leak_rate)


def evaluate(evidence: Evidence, guard: GuardSpec) -> Verdict:
    """The first check with something to say decides."""
    for check in CHECKS:
        verdict = check(evidence, guard)
        if verdict is not None:
            return verdict
    raise AssertionError("_leak_rate always returns a verdict")

"""A probe's outcome from its canary responses and leaks: the guard's anytime-valid test."""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import Field

from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.bisect import BisectModel
from dsv4_operator.guard.sequential import LeakRateTest, Sequential

# Canary responses a probe may take before it is inconclusive when the caller sets none: the
# mixture test needs ~350 clean responses to establish a rate below a 2% threshold at alpha
# 0.01, and a 17% rate is Above after ~40 (bench/bisect.py).
DEFAULT_MAX_RESPONSES = 2000


class Outcome(StrEnum):
    """What one probe configuration showed: `inconclusive` is skipped, never a failure."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


class ProbeEvidence(BisectModel):
    """What a probe's outcome rests on (kept in status, printed by `dsv4 bisect`)."""

    model_config = BisectModel.model_config | {"frozen": True}

    responses: int = Field(ge=0, description="Canary responses judged.")
    leaks: int = Field(ge=0, description="Responses that leaked a tool call.")
    threshold: float = Field(description="Leak rate that fails (spec.guard.leakRate.threshold).")
    alpha: float = Field(description="Bound on a wrong verdict of the sequential test.")
    log_evidence_above: float = Field(
        description="log of the test martingale against `rate <= threshold` (fail at log(1/alpha))."
    )
    log_evidence_below: float = Field(
        description="log of the test martingale against `rate >= threshold` (pass at log(1/alpha))."
    )
    detail: str = Field(default="", description="Why, in words.")


class ProbeJudge(BisectModel):
    """The rule a probe is judged by: the guard's threshold and alpha, and a response budget."""

    model_config = BisectModel.model_config | {"frozen": True}

    threshold: float = Field(gt=0.0, lt=1.0)
    alpha: float = Field(gt=0.0, lt=1.0)
    max_responses: int = Field(default=DEFAULT_MAX_RESPONSES, ge=1)

    @classmethod
    def from_guard(cls, guard: GuardSpec, max_responses: int = DEFAULT_MAX_RESPONSES) -> ProbeJudge:
        """spec.guard.leakRate.threshold with the tap's alpha (the production test's own)."""
        return cls(
            threshold=guard.leak_rate.threshold, alpha=guard.tap.alpha, max_responses=max_responses
        )

    @property
    def test(self) -> LeakRateTest:
        return LeakRateTest(self.threshold, self.alpha)


def judge(leaks: int, responses: int, rule: ProbeJudge) -> tuple[Outcome | None, ProbeEvidence]:
    """The probe's outcome so far: None while the test is undecided and responses remain.

    Fail when the test says the rate is above the threshold, pass when it says below, and
    inconclusive when the response budget ends first. The test is anytime-valid, so calling
    this after every response keeps each wrong verdict's chance at most alpha.
    """
    if not 0 <= leaks <= responses:
        raise ValueError(f"need 0 <= leaks ({leaks}) <= responses ({responses})")
    test = rule.test
    above = test.log_evidence_above(leaks, responses)
    below = test.log_evidence_below(leaks, responses)
    decision = test.decide(leaks, responses)
    rate = f"{leaks}/{responses} leaked" if responses else "no responses"
    outcome: Outcome | None
    if decision is Sequential.ABOVE:
        outcome, why = Outcome.FAIL, f"{rate}: above {rule.threshold:.1%}"
    elif decision is Sequential.BELOW:
        outcome, why = Outcome.PASS, f"{rate}: below {rule.threshold:.1%}"
    elif responses >= rule.max_responses:
        outcome, why = (
            Outcome.INCONCLUSIVE,
            f"{rate}: neither above nor below {rule.threshold:.1%} after {rule.max_responses} "
            "responses",
        )
    else:
        outcome, why = None, f"{rate}: undecided"
    evidence = ProbeEvidence(
        responses=responses,
        leaks=leaks,
        threshold=rule.threshold,
        alpha=rule.alpha,
        log_evidence_above=_finite(above),
        log_evidence_below=_finite(below),
        detail=f"{why} (anytime-valid test, alpha {rule.alpha:g})",
    )
    return outcome, evidence


def _finite(value: float) -> float:
    """JSON has no infinities; a log evidence of -inf (impossible alternative) is stored low."""
    return max(value, -1e9) if not math.isnan(value) else 0.0

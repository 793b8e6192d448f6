"""bisect/outcome.py: a probe fails when the anytime-valid test says above the threshold,
passes when it says below, and is inconclusive when its responses run out first."""

from __future__ import annotations

import pytest

from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.bisect.outcome import Outcome, ProbeEvidence, ProbeJudge, judge

RULE = ProbeJudge(threshold=0.02, alpha=0.01, max_responses=400)


def test_a_leaky_probe_fails_with_its_evidence() -> None:
    outcome, evidence = judge(leaks=12, responses=60, rule=RULE)
    assert outcome is Outcome.FAIL
    assert (evidence.responses, evidence.leaks) == (60, 12)
    assert evidence.log_evidence_above >= 4.6  # log(1 / 0.01)
    assert "above 2.0%" in evidence.detail


def test_a_clean_probe_passes_once_the_test_establishes_below() -> None:
    assert judge(0, 50, RULE)[0] is None  # too few responses to say below 2%
    outcome, evidence = judge(0, 400, RULE)
    assert outcome is Outcome.PASS
    assert evidence.log_evidence_below >= 4.6


def test_a_rate_near_the_threshold_is_inconclusive_when_responses_run_out() -> None:
    assert judge(8, 399, RULE)[0] is None
    outcome, evidence = judge(8, 400, RULE)
    assert outcome is Outcome.INCONCLUSIVE
    assert "after 400 responses" in evidence.detail


def test_the_judge_is_the_guards_threshold_and_alpha() -> None:
    guard = GuardSpec.model_validate({"leakRate": {"threshold": 0.05}, "tap": {"alpha": 0.02}})
    rule = ProbeJudge.from_guard(guard, max_responses=100)
    assert (rule.threshold, rule.alpha, rule.max_responses) == (0.05, 0.02, 100)


def test_evidence_round_trips_json_and_bad_counts_are_refused() -> None:
    _, evidence = judge(3, 10, RULE)
    assert ProbeEvidence.model_validate_json(evidence.model_dump_json()) == evidence
    with pytest.raises(ValueError, match="leaks"):
        judge(11, 10, RULE)

"""The guard's traffic signal: tap counters to new responses, and the anytime-valid verdict."""

from __future__ import annotations

from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.guard.observations import Observations
from dsv4_operator.guard.policy import Evidence, evaluate
from dsv4_operator.guard.taps import TrafficDeltas, parse_counts, samples_and_leaks
from dsv4_operator.reasons import GuardResult, RollbackReason
from dsv4_operator.signals.taps import pod_url

TAP_METRICS = """\
# HELP dsv4_traffic_responses_total Tool-calling responses.
# TYPE dsv4_traffic_responses_total counter
dsv4_traffic_responses_total{deployment="d",verdict="ok"} 90.0
dsv4_traffic_responses_total{deployment="d",verdict="leaked_markup"} 8.0
dsv4_traffic_responses_total{deployment="d",verdict="degenerate"} 1.0
dsv4_traffic_responses_total{deployment="d",verdict="error"} 3.0
# HELP dsv4_traffic_requests_total Requests.
# TYPE dsv4_traffic_requests_total counter
dsv4_traffic_requests_total{deployment="d",tool_calling="true"} 102.0
"""


def test_tap_counters_become_new_responses_per_tap() -> None:
    counts = parse_counts(TAP_METRICS)
    assert counts == {"ok": 90.0, "leaked_markup": 8.0, "degenerate": 1.0, "error": 3.0}
    deltas = TrafficDeltas()
    tap = ("ns/d", "http://10.0.0.1:9100/metrics")
    assert deltas.advance(tap, counts) == {}  # the first look only sets the baseline
    later = {**counts, "ok": 100.0, "leaked_markup": 9.0}
    new = deltas.advance(tap, later)
    assert new == {"ok": 10.0, "leaked_markup": 1.0}
    assert samples_and_leaks(new) == (11, 1)
    # A restarted tap counts from zero: its count is all new.
    assert deltas.advance(tap, {"ok": 4.0}) == {"ok": 4.0}
    deltas.retain("ns/d", set())
    assert deltas.advance(tap, {"ok": 50.0}) == {}  # forgotten: a baseline again


def test_retain_forgets_only_the_owners_gone_sources() -> None:
    deltas = TrafficDeltas()
    for tap in [("ns/a", "http://a1"), ("ns/a", "http://a2"), ("ns/b", "http://b1")]:
        deltas.advance(tap, {"ok": 10.0})
    deltas.retain("ns/a", {"http://a2"})
    assert deltas.advance(("ns/a", "http://a1"), {"ok": 12.0}) == {}  # forgotten: baseline
    assert deltas.advance(("ns/a", "http://a2"), {"ok": 12.0}) == {"ok": 2.0}
    assert deltas.advance(("ns/b", "http://b1"), {"ok": 13.0}) == {"ok": 3.0}  # another owner's


def test_traffic_is_counted_for_its_revision_and_a_new_revision_starts_over() -> None:
    observations = Observations()
    key = ("ns", "d")
    observations.record_traffic(key, "r1", 100, 3)
    observations.record_traffic(key, "r1", 50, 2)
    snapshot = observations.snapshot(key)
    assert snapshot is not None
    assert (snapshot.traffic_samples, snapshot.traffic_leaks) == (150, 5)
    observations.record_traffic(key, "r2", 10, 0)
    snapshot = observations.snapshot(key)
    assert snapshot is not None
    assert (snapshot.revision, snapshot.traffic_samples, snapshot.samples) == ("r2", 10, 0)


def test_a_leaking_revision_is_rolled_back_on_traffic_before_the_canary_has_enough() -> None:
    guard = GuardSpec()
    # 40/500 = 8% of production responses leaked; the canary has seen 0 of its 30.
    verdict = evaluate(Evidence(traffic_samples=500, traffic_leaks=40), guard)
    assert (verdict.outcome, verdict.reason) == (GuardResult.FAIL, "TrafficLeakRate")
    assert verdict.rollback_reason is RollbackReason.LEAK_RATE
    assert "40/500 tool-calling responses leaked" in verdict.message


def test_healthy_or_scant_traffic_leaves_the_verdict_to_the_canary() -> None:
    guard = GuardSpec()
    for samples, leaks in ((500, 2), (20, 1), (0, 0)):
        verdict = evaluate(Evidence(traffic_samples=samples, traffic_leaks=leaks), guard)
        assert verdict.reason == "TooFewSamples"  # the canary's (no canary samples yet)
    off = GuardSpec.model_validate({"tap": {"enabled": False}})
    verdict = evaluate(Evidence(traffic_samples=500, traffic_leaks=40), off)
    assert verdict.outcome is GuardResult.NO_DATA


def test_a_pod_url_brackets_an_ipv6_pod_ip() -> None:
    assert pod_url("10.1.2.3", 9100) == "http://10.1.2.3:9100/metrics"
    assert pod_url("fd00:10:244::7", 9100) == "http://[fd00:10:244::7]:9100/metrics"

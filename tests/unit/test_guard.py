"""Guard policy, OOM signals, and rollback decisions (pure)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.guard.observations import PROMETHEUS, Observations, Snapshot
from dsv4_operator.guard.oom import oom_events
from dsv4_operator.guard.policy import Evidence, evaluate
from dsv4_operator.leak.stats import wilson_interval
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import GuardResult, RollbackReason
from dsv4_operator.reconcile.decide import decide
from tests.support.builders import NOW, as_live, engine_pod, make_world

GUARD = GuardSpec()


def test_wilson_interval_known_values() -> None:
    low, high = wilson_interval(5, 100, 0.95)
    assert low == pytest.approx(0.0215, abs=1e-3) and high == pytest.approx(0.1118, abs=1e-3)
    assert wilson_interval(0, 0, 0.95) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("evidence", "outcome", "reason"),
    [
        (Evidence(samples=10, leaks=5), GuardResult.NO_DATA, "TooFewSamples"),
        (Evidence(samples=32, leaks=6), GuardResult.FAIL, "LeakRate"),  # ~17%: the incident's bug
        (Evidence(samples=600, leaks=0), GuardResult.PASS, "LeakRate"),
        (Evidence(samples=300, leaks=0), GuardResult.NO_DATA, "Inconclusive"),
        (Evidence(samples=40, leaks=1), GuardResult.NO_DATA, "Inconclusive"),
        (Evidence(samples=300, leaks=0, oom_events=1), GuardResult.FAIL, "OOMBeforeBake"),
        (Evidence(samples=300, leaks=0, oom_events=1, baked=True), GuardResult.FAIL, "OOMEvents"),
        (Evidence(source_error="timeout"), GuardResult.ERROR, "SourceError"),
        (Evidence(prometheus_leak_rate=0.2), GuardResult.FAIL, "PrometheusLeakRate"),
        (Evidence(prometheus_leak_rate=0.001), GuardResult.PASS, "PrometheusLeakRate"),
    ],
)
def test_policy_chain(evidence: Evidence, outcome: GuardResult, reason: str) -> None:
    verdict = evaluate(evidence, GUARD)
    assert (verdict.outcome, verdict.reason) == (outcome, reason)
    assert verdict.message


def test_the_confidence_is_printed_as_it_is() -> None:
    for confidence, printed in ((0.999, "99.9%"), (0.99, "99%")):
        guard = GUARD.model_copy(deep=True)
        guard.leak_rate.confidence = confidence
        message = evaluate(Evidence(samples=32, leaks=6), guard).message
        assert f"(18.8%, {printed} bounds " in message


def test_rollback_reasons() -> None:
    assert evaluate(Evidence(samples=32, leaks=6), GUARD).rollback_reason == "LeakRate"
    assert evaluate(Evidence(oom_events=1), GUARD).rollback_reason == "OOM"
    assert evaluate(Evidence(source_error="x"), GUARD).rollback_reason is None
    assert evaluate(Evidence(prometheus_leak_rate=0.2), GUARD).rollback_reason == "LeakRate"


def test_no_data_after_bake_is_a_check_in_the_chain() -> None:
    fail = GuardSpec.model_validate({"noData": "Fail", "bakeTime": "10m"})
    inconclusive = Evidence(samples=10, leaks=0, settled=True)
    assert evaluate(inconclusive, fail).outcome == GuardResult.NO_DATA  # no window age yet
    baked_long = Evidence(samples=10, leaks=0, settled=True, window_age=timedelta(minutes=10))
    verdict = evaluate(baked_long, fail)
    assert (verdict.outcome, verdict.reason) == (GuardResult.FAIL, "NoData")
    assert verdict.rollback_reason is RollbackReason.NO_DATA
    assert "bakeTime 10m" in verdict.message
    # Not settled, or noData Hold, or a conclusive window: the chain goes on as before.
    unsettled = Evidence(samples=10, leaks=0, window_age=timedelta(hours=1))
    assert evaluate(unsettled, fail).outcome == GuardResult.NO_DATA
    hold = GuardSpec.model_validate({"noData": "Hold", "bakeTime": "10m"})
    assert evaluate(baked_long, hold).outcome == GuardResult.NO_DATA
    clean = Evidence(samples=600, leaks=0, settled=True, window_age=timedelta(hours=1))
    assert evaluate(clean, fail).outcome == GuardResult.PASS


def test_oom_signatures() -> None:
    at = "2026-11-29T11:59:00Z"
    pods = [
        engine_pod("r1", {"reason": "OOMKilled", "exitCode": 137, "finishedAt": at}),
        engine_pod(
            "r1",
            {
                "reason": "Error",
                "exitCode": 1,
                "finishedAt": "2026-11-29T11:58:00Z",
                "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate",
            },
        ),
        engine_pod(
            "r1",
            {
                "reason": "Error",
                "exitCode": 1,
                "finishedAt": "2026-11-29T11:57:00Z",
                "message": "ValueError: something else",
            },
        ),
    ]
    events = oom_events([PodView.of(p) for p in pods])
    assert sorted(e.kind for e in events) == ["CudaOOM", "OOMKilled"]
    assert all(e.revision == "r1" and e.role == "decode" for e in events)


def _served(
    variant: Callable[..., dict[str, Any]], changes: dict[str, Any]
) -> tuple[dict[str, Any], Any]:
    spec = variant(changes)
    first = decide(make_world(spec))
    return spec, first


def test_leak_fail_rolls_back_to_last_known_good_and_quarantines(
    variant: Callable[..., dict[str, Any]],
) -> None:
    _, good = _served(variant, {})
    good_rev = good.create[0]["metadata"]["labels"]["dsv4.io/revision"]
    bad_spec = variant(
        {"engine.indexKDtype": "bf16", "engine.hicache": {"enabled": True}, "safety.policy": "Warn"}
    )
    bad_first = decide(
        make_world(
            bad_spec,
            generation=2,
            revisions=good.create,
            status={"lastKnownGoodRevision": good_rev},
        )
    )
    bad_rev = bad_first.create[0]["metadata"]["labels"]["dsv4.io/revision"]
    # The bad revision is served (rolled out and ready) and the canary saw 6/32 leaks.
    served = decide(make_world(bad_spec, generation=2, revisions=good.create))
    live = as_live([o for o in served.apply])
    status = {"lastKnownGoodRevision": good_rev, "currentRevision": bad_rev}
    world = make_world(
        bad_spec,
        generation=2,
        status=status,
        revisions=good.create + bad_first.create,
        canary=Snapshot(revision=bad_rev, samples=32, leaks=6),
        **live,
    )
    decision = decide(world)
    assert decision.rollbacks == ["LeakRate"]
    [entry] = decision.status.quarantine
    assert entry.hash == bad_rev and entry.reason == "LeakRate"
    conditions = {c.type: c for c in decision.status.conditions}
    assert conditions["RolledBack"].status == "True"
    assert conditions["RolledBack"].reason == "LeakRate"
    assert any(n.reason == "RolledBack" for n in decision.events)
    # The rollout now targets the good revision (a format change: Recreate deletes first).
    assert any(r.kind == "StatefulSet" for r, _ in decision.delete)
    # Next passes keep the quarantine: the user's spec is not rolled out again.
    later = decide(
        make_world(
            bad_spec,
            generation=2,
            status=decision.status,
            revisions=good.create + bad_first.create,
        )
    )
    assert all(
        o["metadata"]["labels"].get("dsv4.io/revision", good_rev) == good_rev
        for o in later.apply
        if o["kind"] == "StatefulSet"
    )
    assert later.status.quarantine == decision.status.quarantine
    # The clear annotation releases it.
    cleared = decide(
        make_world(
            bad_spec,
            generation=2,
            status=decision.status,
            revisions=good.create + bad_first.create,
            annotations={"dsv4.io/clear-quarantine": bad_rev},
        )
    )
    assert cleared.status.quarantine == []
    assert any(n.reason == "QuarantineCleared" for n in cleared.events)


def test_no_known_good_degrades_without_revert(variant: Callable[..., dict[str, Any]]) -> None:
    spec, first = _served(variant, {})
    rev = first.create[0]["metadata"]["labels"]["dsv4.io/revision"]
    world = make_world(
        spec,
        revisions=first.create,
        canary=Snapshot(revision=rev, samples=32, leaks=6),
        **as_live(first.apply),
    )
    decision = decide(world)
    assert decision.rollbacks == [] and decision.delete == [] and decision.apply == []
    conditions = {c.type: c for c in decision.status.conditions}
    assert conditions["Degraded"].status == "True"
    assert conditions["Degraded"].reason == "NoKnownGood"
    assert decision.status.phase == "Degraded"
    assert any(n.reason == "NoKnownGood" for n in decision.events)


def test_bake_promotes_last_known_good(variant: Callable[..., dict[str, Any]]) -> None:
    spec, first = _served(variant, {"guard.bakeTime": "10m"})
    rev = first.create[0]["metadata"]["labels"]["dsv4.io/revision"]
    live = as_live(first.apply)
    passing = Snapshot(revision=rev, samples=1000, leaks=0)
    started = decide(make_world(spec, revisions=first.create, canary=passing, **live))
    assert started.status.last_known_good_revision is None
    assert started.status.guard is not None
    assert started.status.guard.passing_since == "2026-11-29T12:00:00Z"
    later = make_world(
        spec,
        revisions=first.create,
        canary=passing,
        status=started.status,
        now=NOW + timedelta(minutes=11),
        **live,
    )
    baked = decide(later)
    assert baked.status.last_known_good_revision == rev
    assert any(n.reason == "Baked" for n in baked.events)


def test_errors_make_the_guard_blind_without_rollback(
    variant: Callable[..., dict[str, Any]],
) -> None:
    spec, first = _served(variant, {"guard.errorLimit": 3})
    rev = first.create[0]["metadata"]["labels"]["dsv4.io/revision"]
    blind = Snapshot(revision=rev, source_errors={"prometheus": (3, "prometheus: ConnectError")})
    decision = decide(
        make_world(
            spec,
            revisions=first.create,
            canary=blind,
            status={"lastKnownGoodRevision": "elsewhere"},
            **as_live(first.apply),
        )
    )
    conditions = {c.type: c for c in decision.status.conditions}
    assert conditions["GuardBlind"].status == "True"
    assert decision.status.guard is not None
    assert decision.status.guard.last_verdict == "Error"
    assert decision.rollbacks == [] and decision.delete == []


def test_a_blind_guard_writes_its_status_once_not_every_round(
    variant: Callable[..., dict[str, Any]],
) -> None:
    """Engines unreachable: each round counts one more error in a row. The status (what act()
    writes when its visible form changes) changes when the guard goes blind, then not again
    while the cause stays the same; the count is a metric (dsv4_guard_source_errors)."""
    spec, first = _served(variant, {"guard.errorLimit": 3})
    rev = first.create[0]["metadata"]["labels"]["dsv4.io/revision"]
    cause = "canary against http://x-router.ns:8000: all 8 requests failed, the first with 503"
    live = as_live(first.apply)
    status: Any = {"lastKnownGoodRevision": "elsewhere"}
    written: list[int] = []
    for errors in (3, 4, 5, 6):
        world = make_world(
            spec,
            revisions=first.create,
            canary=Snapshot(revision=rev, source_errors={"canary": (errors, cause)}),
            status=status,
            **live,
        )
        decision = decide(world)
        if decision.status.visible_wire() != world.status.visible_wire():
            written.append(errors)
        status = decision.status
    assert written == [3]  # going blind; rounds 4, 5 and 6 change nothing a user sees
    blind = next(c for c in status.conditions if c.type == "GuardBlind")
    assert blind.status == "True" and cause in blind.message


def test_oom_on_unbaked_revision_rolls_back(variant: Callable[..., dict[str, Any]]) -> None:
    _, good = _served(variant, {})
    good_rev = good.create[0]["metadata"]["labels"]["dsv4.io/revision"]
    new_spec = variant({"engine.maxRunningRequests": 48})
    new = decide(make_world(new_spec, generation=2, revisions=good.create))
    new_rev = new.create[0]["metadata"]["labels"]["dsv4.io/revision"]
    live = as_live(new.apply)
    pod = copy.deepcopy(
        engine_pod(
            new_rev, {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-11-29T11:59:30Z"}
        )
    )
    world = make_world(
        new_spec,
        generation=2,
        revisions=good.create + new.create,
        pods=[pod],
        status={"lastKnownGoodRevision": good_rev},
        **live,
    )
    decision = decide(world)
    assert decision.rollbacks == ["OOM"]
    assert decision.status.quarantine[0].hash == new_rev
    assert [e.kind for e in decision.ooms] == ["OOMKilled"]


def test_each_source_is_counted_on_its_own() -> None:
    """A Prometheus that answers must not hide a canary that keeps failing (and vice versa)."""
    obs, key, at = Observations(), ("ns", "x"), NOW
    for _ in range(3):
        obs.record_error(key, "canary against http://x: ConnectError", at)
        obs.record_prometheus(key, leak_rate=0.0, oom_events=0.0)  # answers, empty
    snap = obs.snapshot(key)
    assert snap is not None and snap.consecutive_errors == 3
    assert snap.last_error == "canary against http://x: ConnectError (3 in a row)"
    obs.record_error(key, "prometheus: ReadTimeout", at, source=PROMETHEUS)
    snap = obs.snapshot(key)
    assert snap is not None and snap.consecutive_errors == 3
    assert snap.last_error is not None
    assert "canary" in snap.last_error and "prometheus: ReadTimeout (1 in a row)" in snap.last_error
    obs.record(key, "r1", {"ok": 4}, 0, at)  # the canary answers: only its count resets
    snap = obs.snapshot(key)
    assert snap is not None and snap.consecutive_errors == 1
    assert snap.last_error == "prometheus: ReadTimeout (1 in a row)"


@pytest.mark.parametrize(
    ("confidence", "text"), [(0.999, "99.9%"), (0.99, "99%"), (0.9995, "99.95%")]
)
def test_leak_rate_messages_print_the_confidence_as_it_is(confidence: float, text: str) -> None:
    """0.999 is "99.9% bounds": rounded to "100%", the message would claim certainty."""
    guard = GuardSpec.model_validate({"leakRate": {"confidence": confidence}})
    verdict = evaluate(Evidence(samples=40, leaks=1), guard)
    assert f", {text} bounds " in verdict.message

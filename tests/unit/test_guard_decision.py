"""The guard's whole decision, `decide_guard`, as a table: one row per situation, its input
(policy, the previous window, what the canary saw, quarantine, the known-good target, the
settled revision, the clear-quarantine annotation, pods with OOM) and the outcome a reader of
docs/guard.md expects (target, quarantine, rollback reason, bake, blind, Events' reasons).

Each expectation is written from the policy, not read off the function: the canary counts are
chosen far on one side of the policy's threshold, windows are dated against its bakeTime and
OOM window, errors counted against its errorLimit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import pytest

from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.api.status import Condition, ConditionType, GuardStatus, QuarantineEntry
from dsv4_operator.guard.decision import GuardInput, decide_guard
from dsv4_operator.guard.engine import EngineCounts
from dsv4_operator.guard.observations import CANARY, Snapshot
from dsv4_operator.names import format_time, revision_name
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import RollbackReason
from tests.support.builders import NOW, engine_pod

DEPLOYMENT = "x"
USER = "u5er"  # the revision of the spec as the user wrote it
GOOD = "g00d"  # the last known good revision (what a rollback goes to)
POLICY = GuardSpec()
BAKE = POLICY.bake_time.delta
OOM_WINDOW = POLICY.oom.window.delta
UNCHECKED = object()
BAKED_TOLERATES_ONE_OOM = GuardSpec.model_validate({"oom": {"maxEvents": 2}})
NO_DATA_FAILS = GuardSpec.model_validate({"noData": "Fail"})


def passing(revision: str = USER, policy: GuardSpec = POLICY) -> Snapshot:
    """Far below the threshold: no leak in a hundred times the responses a verdict needs."""
    return Snapshot(revision=revision, samples=100 * policy.leak_rate.min_samples, leaks=0)


def failing(revision: str = USER, policy: GuardSpec = POLICY) -> Snapshot:
    """Far above the threshold: half of twice the responses a verdict needs leaked."""
    samples = 2 * policy.leak_rate.min_samples
    return Snapshot(revision=revision, samples=samples, leaks=samples // 2)


def scant(policy: GuardSpec = POLICY, revision: str = USER) -> Snapshot:
    """Inconclusive: one response fewer than a verdict needs, none leaked."""
    return Snapshot(revision=revision, samples=policy.leak_rate.min_samples - 1, leaks=0)


def engines_saw(
    revision: str = USER,
    dropped: float = 0.0,
    failed: float = 0.0,
    requests: int = 100 * POLICY.kv_integrity.min_requests,
    counted_for: str = USER,
) -> Snapshot:
    """A passing canary window of `revision`, and what the engines of `counted_for` counted:
    a hundred times the KV verdict's minimum of requests, each a tool-calling response, with
    `dropped` of them missing their call and `failed` of their KV transfers failed."""
    counts = EngineCounts(
        responses=requests,
        drops=round(dropped * requests),
        requests=requests,
        transfer_failures=round(failed * requests),
    )
    return Snapshot(
        revision=revision,
        samples=100 * POLICY.leak_rate.min_samples,
        leaks=0,
        engine={counted_for: counts},
    )


# Far on either side of the thresholds: five times the leak threshold and ten times the KV one,
# or nothing at all.
DROPPING = 5 * POLICY.leak_rate.threshold
KV_FAILING = 10 * POLICY.kv_integrity.threshold


def erring(errors: int, revision: str = USER) -> Snapshot:
    """The canary failed `errors` times in a row (and saw nothing)."""
    return Snapshot(revision=revision, source_errors={CANARY: (errors, "canary: timed out")})


def window(
    revision: str = USER,
    passing_for: timedelta | None = None,
    open_for: timedelta = timedelta(hours=1),
) -> GuardStatus:
    """The guard's memory of `revision`'s window, open for `open_for` (at least as long as it
    has been passing), passing for `passing_for`."""
    return GuardStatus(
        revision=revision,
        since=format_time(NOW - max(open_for, passing_for or open_for)),
        passing_since=format_time(NOW - passing_for) if passing_for is not None else None,
    )


def oom_killed(revision: str = USER, ago: timedelta = timedelta(minutes=1)) -> dict[str, Any]:
    """An engine pod of `revision` whose container was OOMKilled `ago`."""
    terminated = {"reason": "OOMKilled", "exitCode": 137, "finishedAt": format_time(NOW - ago)}
    return engine_pod(revision, terminated)


def quarantined(revision: str) -> QuarantineEntry:
    return QuarantineEntry(
        hash=revision,
        revision=revision_name(DEPLOYMENT, revision),
        reason=RollbackReason.LEAK_RATE.value,
        at=format_time(NOW - timedelta(hours=2)),
    )


def condition(type_: ConditionType, status: Literal["True", "False"]) -> Condition:
    """A condition the previous pass left (Events fire only when one changes)."""
    return Condition(type=type_, status=status, reason="Before")


@dataclass(frozen=True)
class Situation:
    """The input of one pass; by default the user's revision is rolled out and settled, and a
    known-good revision exists to roll back to."""

    policy: GuardSpec = field(default_factory=lambda: POLICY)
    previous: GuardStatus | None = None
    snapshot: Snapshot | None = None
    quarantine: tuple[QuarantineEntry, ...] = ()
    last_known_good: str | None = GOOD
    known_good_target: str | None = GOOD
    settled: str | None = USER
    cleared: str | None = None
    pods: tuple[dict[str, Any], ...] = ()
    conditions: tuple[Condition, ...] = ()
    plan_mismatch: tuple[str, ...] = ()  # revisions whose engines report another plan

    def given(self) -> GuardInput:
        return GuardInput(
            deployment=DEPLOYMENT,
            policy=self.policy,
            last_known_good=self.last_known_good,
            previous=self.previous,
            quarantine=list(self.quarantine),
            conditions=list(self.conditions),
            snapshot=self.snapshot,
            pods=[PodView.of(p) for p in self.pods],
            user_revision=USER,
            known_good_target=self.known_good_target,
            settled_revision=self.settled,
            cleared=self.cleared,
            now=NOW,
            plan_mismatch={
                r: f"engine pod of {r} reports another pool" for r in self.plan_mismatch
            },
        )


@dataclass(frozen=True)
class Expected:
    """The outcome: by default the user's revision stays the target and nothing happens."""

    target: str | None = USER
    quarantine: tuple[str, ...] = ()  # the hashes quarantined after the pass
    rollback: RollbackReason | None = None  # a rollback made in this pass, and why
    rolled_back: str | None = None  # the quarantined revision the target replaces
    baked: str | None = None  # the revision that became the last known good one
    blind: bool = False
    no_known_good: bool = False
    events: tuple[str, ...] = ()  # the Events' reasons, in order
    cleared: bool = False
    fresh_window: bool = False  # the window restarts: no sample carried over
    judged: str = USER  # the revision whose window was judged (before any rollback)
    verdict: str | None = None  # its verdict (None: nothing judged, the memory stays)
    guard: GuardStatus | None = None  # the guard's memory, where the row says it exactly
    passing_since: Any = UNCHECKED  # when the bake clock started (None: stopped)
    reason: str | None = None  # the verdict's reason (status.guard.lastReason), where it matters


def rolls_back(reason: RollbackReason, because: str | None = None) -> Expected:
    """The user's revision fails for `reason` (the verdict's reason `because`): quarantined,
    the known-good one the target, one RolledBack Event."""
    return Expected(
        target=GOOD,
        quarantine=(USER,),
        rollback=reason,
        rolled_back=USER,
        events=("RolledBack",),
        verdict="Fail",
        reason=because,
    )


ROWS: dict[str, tuple[Situation, Expected]] = {
    "a pass keeps the target and starts the bake clock": (
        Situation(snapshot=passing()),
        Expected(verdict="Pass", passing_since=format_time(NOW)),
    ),
    "a pass for bakeTime bakes the revision": (
        Situation(previous=window(passing_for=BAKE), snapshot=passing()),
        Expected(baked=USER, events=("Baked",), verdict="Pass"),
    ),
    "a pass one second short of bakeTime does not bake yet": (
        Situation(previous=window(passing_for=BAKE - timedelta(seconds=1)), snapshot=passing()),
        Expected(verdict="Pass"),
    ),
    "a pass while the rollout is not settled never bakes": (
        Situation(previous=window(passing_for=10 * BAKE), snapshot=passing(), settled=GOOD),
        Expected(verdict="Pass", passing_since=format_time(NOW - 10 * BAKE)),
    ),
    "a pass with nothing settled never bakes": (
        Situation(previous=window(passing_for=10 * BAKE), snapshot=passing(), settled=None),
        Expected(verdict="Pass"),
    ),
    "a pass for bakeTime on the known-good revision bakes nothing again": (
        Situation(
            previous=window(passing_for=BAKE),
            snapshot=passing(),
            last_known_good=USER,
            known_good_target=USER,
        ),
        Expected(verdict="Pass"),
    ),
    "a fail with a known-good target rolls back and quarantines": (
        Situation(snapshot=failing()),
        rolls_back(RollbackReason.LEAK_RATE),
    ),
    "a fail without a known-good revision keeps the target and says so": (
        Situation(snapshot=failing(), last_known_good=None, known_good_target=None),
        Expected(no_known_good=True, events=("NoKnownGood",), verdict="Fail"),
    ),
    "a fail without a known-good revision, already Degraded, posts no second Event": (
        Situation(
            snapshot=failing(),
            last_known_good=None,
            known_good_target=None,
            conditions=(condition("Degraded", "True"),),
        ),
        Expected(no_known_good=True, verdict="Fail"),
    ),
    "no data under noData Hold keeps the target, however long the window": (
        Situation(previous=window(), snapshot=scant()),
        Expected(verdict="NoData"),
    ),
    "no data under noData Fail, settled for bakeTime, rolls back": (
        Situation(
            policy=NO_DATA_FAILS, previous=window(open_for=BAKE), snapshot=scant(NO_DATA_FAILS)
        ),
        rolls_back(RollbackReason.NO_DATA),
    ),
    "no data under noData Fail, settled one second short of bakeTime, keeps collecting": (
        Situation(
            policy=NO_DATA_FAILS,
            previous=window(open_for=BAKE - timedelta(seconds=1)),
            snapshot=scant(NO_DATA_FAILS),
        ),
        Expected(verdict="NoData"),
    ),
    "no data under noData Fail, not settled, keeps collecting": (
        Situation(
            policy=NO_DATA_FAILS, previous=window(), snapshot=scant(NO_DATA_FAILS), settled=GOOD
        ),
        Expected(verdict="NoData"),
    ),
    "a quarantined user revision targets the known-good one": (
        Situation(quarantine=(quarantined(USER),), settled=GOOD),
        Expected(target=GOOD, quarantine=(USER,), rolled_back=USER, judged=GOOD, verdict="NoData"),
    ),
    "a quarantined user revision whose known-good target fails rolls back no further": (
        Situation(quarantine=(quarantined(USER),), snapshot=failing(GOOD), settled=GOOD),
        Expected(target=GOOD, quarantine=(USER,), rolled_back=USER, judged=GOOD, verdict="Fail"),
    ),
    "a quarantined user revision with no known-good one targets nothing": (
        Situation(quarantine=(quarantined(USER),), last_known_good=None, known_good_target=None),
        Expected(
            target=None,
            quarantine=(USER,),
            rolled_back=USER,
            no_known_good=True,
            events=("NoKnownGood",),
        ),
    ),
    "the clear annotation releases the revision and restarts its window": (
        Situation(
            quarantine=(quarantined(USER), quarantined("0ther")),
            cleared=USER,
            previous=GuardStatus(revision=USER, since=format_time(NOW - timedelta(hours=3))),
            snapshot=failing(),
        ),
        Expected(
            quarantine=("0ther",),
            events=("QuarantineCleared",),
            cleared=True,
            fresh_window=True,
            verdict="NoData",
        ),
    ),
    "a clear annotation naming no quarantined revision changes nothing": (
        Situation(quarantine=(quarantined("0ther"),), cleared=USER, snapshot=passing()),
        Expected(quarantine=("0ther",), verdict="Pass"),
    ),
    "a source error stops the bake clock": (
        Situation(previous=window(passing_for=10 * BAKE), snapshot=erring(1)),
        Expected(verdict="Error", passing_since=None),
    ),
    "source errors below errorLimit are not blind yet": (
        Situation(snapshot=erring(POLICY.error_limit - 1)),
        Expected(verdict="Error"),
    ),
    "source errors at errorLimit are blind, with one GuardBlind Event": (
        Situation(snapshot=erring(POLICY.error_limit)),
        Expected(blind=True, events=("GuardBlind",), verdict="Error"),
    ),
    "source errors past errorLimit, already blind, post no second Event": (
        Situation(
            snapshot=erring(POLICY.error_limit + 3),
            conditions=(condition("GuardBlind", "True"),),
        ),
        Expected(blind=True, verdict="Error"),
    ),
    "an OOM on a revision that has not baked fails at once": (
        Situation(snapshot=passing(), pods=(oom_killed(),)),
        rolls_back(RollbackReason.OOM),
    ),
    "an OOM on a revision that has not baked fails at once, even below maxEvents": (
        Situation(policy=BAKED_TOLERATES_ONE_OOM, snapshot=passing(), pods=(oom_killed(),)),
        rolls_back(RollbackReason.OOM),
    ),
    "an OOM on a baked revision, below the policy's maxEvents, does not fail": (
        Situation(
            policy=BAKED_TOLERATES_ONE_OOM,
            snapshot=passing(),
            last_known_good=USER,
            known_good_target=USER,
            pods=(oom_killed(),),
        ),
        Expected(verdict="Pass"),
    ),
    "an OOM on a baked revision at the policy's maxEvents fails, with nothing older to go to": (
        Situation(
            snapshot=passing(),
            last_known_good=USER,
            known_good_target=USER,
            pods=(oom_killed(),),
        ),
        Expected(no_known_good=True, events=("NoKnownGood",), verdict="Fail"),
    ),
    "an OOM older than the OOM window does not count": (
        Situation(snapshot=passing(), pods=(oom_killed(ago=OOM_WINDOW + timedelta(minutes=1)),)),
        Expected(verdict="Pass"),
    ),
    "an OOM of another revision does not count": (
        Situation(snapshot=passing(), pods=(oom_killed(revision=GOOD),)),
        Expected(verdict="Pass"),
    ),
    "the engines dropping tool calls above the threshold roll back, as a leak": (
        Situation(snapshot=engines_saw(dropped=DROPPING)),
        rolls_back(RollbackReason.LEAK_RATE, "EngineToolCallDrops"),
    ),
    "the engines dropping no tool call leave the verdict to the canary": (
        Situation(snapshot=engines_saw()),
        Expected(verdict="Pass", reason="LeakRate"),
    ),
    "tool calls dropped by another revision's engines do not count": (
        Situation(snapshot=engines_saw(dropped=DROPPING, counted_for=GOOD)),
        Expected(verdict="Pass", reason="LeakRate"),
    ),
    "dropped tool calls counted before the window's revision served still count": (
        Situation(snapshot=engines_saw(revision=GOOD, dropped=DROPPING), settled=None),
        rolls_back(RollbackReason.LEAK_RATE, "EngineToolCallDrops"),
    ),
    "the engines off, their counts decide nothing": (
        Situation(
            policy=GuardSpec.model_validate({"engine": {"enabled": False}}),
            snapshot=engines_saw(dropped=DROPPING, failed=KV_FAILING),
        ),
        Expected(verdict="Pass"),
    ),
    "the engines' counts in status resume the window after a restart": (
        Situation(
            previous=GuardStatus(
                revision=USER,
                since=format_time(NOW - timedelta(minutes=1)),
                engine_samples=1000,
                engine_leaks=round(1000 * DROPPING),
            )
        ),
        rolls_back(RollbackReason.LEAK_RATE, "EngineToolCallDrops"),
    ),
    "failed KV transfers before the bake roll back for KV integrity": (
        Situation(snapshot=engines_saw(failed=KV_FAILING)),
        rolls_back(RollbackReason.KV_INTEGRITY, "KVIntegrity"),
    ),
    "failed KV transfers win over the canary's errors they cause": (
        Situation(
            snapshot=Snapshot(
                revision=USER,
                source_errors={CANARY: (1, "canary: HTTP 500")},
                engine={USER: EngineCounts(requests=1000, transfer_failures=50)},
            )
        ),
        rolls_back(RollbackReason.KV_INTEGRITY, "KVIntegrity"),
    ),
    "failed KV transfers on a baked revision are the alert's, not a rollback": (
        Situation(
            snapshot=engines_saw(failed=KV_FAILING), last_known_good=USER, known_good_target=USER
        ),
        Expected(verdict="Pass"),
    ),
    "failed KV transfers on fewer requests than minRequests decide nothing yet": (
        Situation(snapshot=engines_saw(failed=0.5, requests=POLICY.kv_integrity.min_requests - 1)),
        Expected(verdict="Pass"),
    ),
    "a pass for bakeTime does not bake while the engines report another plan": (
        Situation(previous=window(passing_for=BAKE), snapshot=passing(), plan_mismatch=(USER,)),
        Expected(verdict="Pass", passing_since=format_time(NOW - BAKE)),
    ),
    "another revision's plan mismatch does not stop the bake": (
        Situation(previous=window(passing_for=BAKE), snapshot=passing(), plan_mismatch=(GOOD,)),
        Expected(baked=USER, events=("Baked",), verdict="Pass"),
    ),
    "the clear annotation forgets the released revision's engine counts too": (
        Situation(
            quarantine=(quarantined(USER),),
            cleared=USER,
            snapshot=engines_saw(revision=GOOD, dropped=DROPPING),
        ),
        Expected(events=("QuarantineCleared",), cleared=True, fresh_window=True, verdict="NoData"),
    ),
    "the guard disabled does nothing, whatever the canary saw": (
        Situation(
            policy=GuardSpec(enabled=False),
            snapshot=failing(),
            pods=(oom_killed(),),
            previous=window(passing_for=10 * BAKE),
        ),
        Expected(guard=window(passing_for=10 * BAKE)),
    ),
}


@pytest.mark.parametrize(("situation", "expected"), ROWS.values(), ids=ROWS.keys())
def test_the_guard_decides_as_its_policy_says(situation: Situation, expected: Expected) -> None:
    outcome = decide_guard(situation.given())

    assert outcome.target == expected.target
    assert [q.hash for q in outcome.quarantine] == list(expected.quarantine)
    assert outcome.rollbacks == ([expected.rollback] if expected.rollback else [])
    assert (outcome.rolled_back.hash if outcome.rolled_back else None) == expected.rolled_back
    assert outcome.last_known_good == (expected.baked or situation.last_known_good)
    assert outcome.blind is expected.blind
    assert (outcome.no_known_good is not None) is expected.no_known_good
    assert [e.reason for e in outcome.events] == list(expected.events)
    assert outcome.cleared is expected.cleared
    if expected.rollback is not None:
        # The entry a rollback adds names the revision, the reason and the time.
        entry = outcome.quarantine[-1]
        assert (entry.revision, entry.reason, entry.at) == (
            revision_name(DEPLOYMENT, USER),
            expected.rollback.value,
            format_time(NOW),
        )
        assert outcome.rolled_back == entry
    if expected.verdict is None:
        assert outcome.guard == situation.previous  # nothing judged: the memory stays
        assert outcome.guard == expected.guard
    else:
        assert outcome.guard is not None
        assert (outcome.guard.revision, outcome.guard.last_verdict) == (
            expected.judged,
            expected.verdict,
        )
    if expected.reason is not None:
        assert outcome.guard is not None
        assert outcome.guard.last_reason == expected.reason
    if expected.passing_since is not UNCHECKED:
        assert outcome.guard is not None
        assert outcome.guard.passing_since == expected.passing_since
    if expected.fresh_window:
        assert outcome.guard is not None
        assert (outcome.guard.samples, outcome.guard.leaks) == (0, 0)
        assert (outcome.guard.engine_samples, outcome.guard.engine_leaks) == (0, 0)
        assert outcome.guard.since == format_time(NOW)


def test_every_row_keeps_the_policy_s_sides_of_the_threshold() -> None:
    """The counts the rows call passing and failing are on the policy's sides of its
    threshold by a wide margin (the Wilson bounds need not be computed to see it)."""
    good, bad = passing(), failing()
    threshold = POLICY.leak_rate.threshold
    assert good.leaks == 0 and good.samples >= 50 / threshold
    assert bad.samples >= POLICY.leak_rate.min_samples and bad.leaks / bad.samples >= 20 * threshold

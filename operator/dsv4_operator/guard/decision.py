"""The guard's whole decision in one reconcile pass (pure): one input in, one outcome out.

In: the guard policy (the user's `spec.guard`), the guard's durable memory (the previous
status: its window, last known good revision, quarantine and conditions), what the signals
saw (the canary/Prometheus snapshot and the pods' OOM terminations), the revisions at stake,
and the clock. Out: which revision to roll out, the guard's new memory, the Events to post
and the rollbacks made.

Steps: release a quarantine entry the user cleared; if the user's revision is quarantined,
target the last known good one; judge the target's window with the policy chain
(guard/policy.py); on a Fail, quarantine the target and roll back to the last known good
revision (or report that there is none); on a long enough run of Pass, bake it into the last
known good revision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.api.status import (
    Condition,
    ConditionType,
    GroupRestart,
    GuardStatus,
    QuarantineEntry,
)
from dsv4_operator.api.times import Timestamp
from dsv4_operator.events import Note
from dsv4_operator.guard.engine import EngineCounts
from dsv4_operator.guard.observations import Snapshot
from dsv4_operator.guard.oom import OomEvent, oom_events, within
from dsv4_operator.guard.policy import Evidence, GuardVerdict, evaluate
from dsv4_operator.names import revision_name
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import EventReason, GuardResult, RollbackReason


@dataclass(frozen=True)
class GuardInput:
    """Everything the guard decides on."""

    deployment: str  # the DSV4Deployment's name (quarantine entries name its revisions)
    policy: GuardSpec
    last_known_good: str | None  # status.lastKnownGoodRevision
    previous: GuardStatus | None  # status.guard
    quarantine: list[QuarantineEntry]  # status.quarantine
    conditions: list[Condition]  # status.conditions (Events fire on a condition's change)
    snapshot: Snapshot | None
    pods: list[PodView]
    user_revision: str  # the revision of the spec as the user wrote it
    # The revision the stored last known good config renders to, None when it is not stored
    # (nothing to roll back to).
    known_good_target: str | None
    settled_revision: str | None  # what every role of the active pair runs, rolled and ready
    cleared: str | None  # the clear-quarantine annotation
    now: datetime
    # Revisions whose engines report other numbers than their plan (PlanVerified=False,
    # PlanMismatch), with why: such a revision is never baked.
    plan_mismatch: Mapping[str, str] = field(default_factory=dict)
    # Multi-node groups' restarts (status.groupRestarts and this pass's): their pods, OOMs
    # included, are gone once the group restarts, so a group's OOM is read from here.
    group_restarts: list[GroupRestart] = field(default_factory=list)


@dataclass(frozen=True)
class GuardDecision:
    """What the guard decided, and its memory for the next pass."""

    target: str | None  # the revision to roll out; None: quarantined, nothing to fall back to
    guard: GuardStatus | None
    last_known_good: str | None
    quarantine: list[QuarantineEntry]
    rolled_back: QuarantineEntry | None
    blind: bool
    no_known_good: str | None
    events: list[Note] = field(default_factory=list)
    rollbacks: list[RollbackReason] = field(default_factory=list)
    ooms: list[OomEvent] = field(default_factory=list)
    cleared: bool = False  # a quarantine entry was released: the guard's window restarts
    # While blind: the failing sources' messages without their counts (GuardBlind's message).
    blind_cause: str | None = None


@dataclass(frozen=True)
class _Window:
    """The judgement of one revision's window in this pass."""

    status: GuardStatus
    verdict: GuardVerdict
    promote: bool
    blind: bool
    ooms: list[OomEvent]


def _engine_counts(
    previous: GuardStatus | None, snapshot: Snapshot | None, subject: str
) -> EngineCounts:
    """The engines' counts for `subject`: recorded per revision (a pod's label says whose),
    else what the same window's status held."""
    recorded = snapshot.engine.get(subject) if snapshot is not None else None
    if recorded is not None:
        return recorded
    if previous is not None:
        return EngineCounts(
            previous.engine_samples,
            previous.engine_leaks,
            previous.kv_requests,
            previous.kv_failures,
        )
    return EngineCounts()


def _judge(
    policy: GuardSpec,
    previous: GuardStatus | None,
    snapshot: Snapshot | None,
    seen: list[OomEvent],
    subject: str,
    baked: bool,
    settled: bool,
    now: datetime,
    plan_mismatch: str | None = None,
) -> _Window:
    """Window bookkeeping and the policy verdict for `subject` (the revision served)."""
    same_window = previous is not None and previous.revision == subject
    since: datetime | None = now
    passing_since: datetime | None = None
    if previous is not None and same_window:
        since = previous.since.at if previous.since else None
        passing_since = previous.passing_since.at if previous.passing_since else None
    if snapshot is not None and snapshot.revision == subject:
        samples, leaks = snapshot.samples, snapshot.leaks
        traffic = (snapshot.traffic_samples, snapshot.traffic_leaks)
    elif previous is not None and same_window:
        samples, leaks = previous.samples, previous.leaks
        traffic = (previous.traffic_samples, previous.traffic_leaks)
    else:
        samples, leaks, traffic = 0, 0, (0, 0)
    engine = _engine_counts(previous if same_window else None, snapshot, subject)
    errors = snapshot.consecutive_errors if snapshot else 0
    ooms = within(seen, subject, now, policy.oom.window.delta)
    evidence = Evidence(
        samples=samples,
        leaks=leaks,
        traffic_samples=traffic[0],
        traffic_leaks=traffic[1],
        engine_samples=engine.responses,
        engine_leaks=engine.drops,
        kv_requests=engine.requests,
        kv_failures=engine.transfer_failures,
        oom_events=len(ooms),
        baked=baked,
        source_error=snapshot.last_error if snapshot and errors else None,
        prometheus_leak_rate=snapshot.prometheus_leak_rate if snapshot else None,
        prometheus_oom_events=snapshot.prometheus_oom_events if snapshot else None,
        settled=settled,
        window_age=now - since if since is not None else None,
    )
    verdict = evaluate(evidence, policy)
    if verdict.outcome == GuardResult.PASS and settled:
        passing_since = passing_since or now
    elif verdict.outcome in (GuardResult.FAIL, GuardResult.ERROR):
        passing_since = None
    promote = bool(
        verdict.outcome == GuardResult.PASS
        and settled
        and not ooms
        and plan_mismatch is None
        and passing_since is not None
        and now - passing_since >= policy.bake_time.delta
    )
    status = GuardStatus(
        revision=subject,
        since=Timestamp.of(since or now),
        samples=samples,
        leaks=leaks,
        traffic_samples=traffic[0],
        traffic_leaks=traffic[1],
        engine_samples=engine.responses,
        engine_leaks=engine.drops,
        kv_requests=engine.requests,
        kv_failures=engine.transfer_failures,
        leak_rate=round(leaks / samples, 4) if samples else None,
        last_verdict=verdict.outcome,
        last_reason=verdict.reason,
        last_message=verdict.message,
        last_sample_time=(
            Timestamp.of(snapshot.last_run)
            if snapshot is not None and snapshot.last_run is not None
            else None
        ),
        oom_events=len(ooms),
        consecutive_errors=errors,
        passing_since=Timestamp.of(passing_since) if passing_since is not None else None,
    )
    return _Window(status, verdict, promote, errors >= policy.error_limit, ooms)


def _was(conditions: list[Condition], type_: ConditionType, status: str) -> bool:
    return any(c.type == type_ and c.status == status for c in conditions)


def decide_guard(given: GuardInput) -> GuardDecision:
    """Quarantine, verdict, rollback and bake: which revision to roll out, and why."""
    events: list[Note] = []
    rollbacks: list[RollbackReason] = []
    ooms: list[OomEvent] = []
    cleared = given.cleared
    quarantine = [q for q in given.quarantine if q.hash != cleared]
    previous_guard, snapshot = given.previous, given.snapshot
    released = len(quarantine) != len(given.quarantine)
    if released:
        events.append(
            Note(
                "Normal",
                EventReason.QUARANTINE_CLEARED,
                f"revision {cleared} released from quarantine",
            )
        )
        # Its old evidence must not quarantine it again at once: a fresh window.
        if previous_guard is not None and previous_guard.revision == cleared:
            previous_guard = None
        if snapshot is not None and cleared:
            snapshot = snapshot.without(cleared)
    lkg = given.last_known_good
    rolled_back = next((q for q in quarantine if q.hash == given.user_revision), None)
    target: str | None = given.user_revision
    no_known_good: str | None = None
    if rolled_back is not None:
        target = given.known_good_target
        if target is None:
            no_known_good = (
                f"revision {given.user_revision} is quarantined and no known-good revision exists"
            )
    guard_status = given.previous
    blind = False
    policy = given.policy
    if policy.enabled and target is not None:
        window = _judge(
            policy,
            previous_guard,
            snapshot,
            oom_events(given.pods, given.group_restarts),
            target,
            baked=lkg == target,
            settled=given.settled_revision == target,
            now=given.now,
            plan_mismatch=given.plan_mismatch.get(target),
        )
        guard_status, blind, ooms = window.status, window.blind, window.ooms
        if given.previous is not None:
            # The culprit search's state and answer outlive the window (api/bisect.py).
            guard_status = guard_status.model_copy(
                update={"bisect": given.previous.bisect, "culprit": given.previous.culprit}
            )
        verdict = window.verdict
        reason = verdict.rollback_reason
        if reason is not None and rolled_back is None:
            entry = QuarantineEntry(
                hash=target,
                revision=revision_name(given.deployment, target),
                reason=reason,
                message=verdict.message,
                at=Timestamp.of(given.now),
            )
            if given.known_good_target is not None and lkg != target:
                quarantine.append(entry)
                rolled_back = entry
                rollbacks.append(reason)
                events.append(
                    Note(
                        "Warning",
                        EventReason.ROLLED_BACK,
                        f"{reason}: {verdict.message}; rolling back from {target} to last "
                        f"known good {lkg}; {target} is quarantined until the spec changes",
                    )
                )
                target = given.known_good_target
            else:
                no_known_good = (
                    f"{verdict.message}; no known-good revision to roll "
                    "back to, keeping the current one"
                )
        elif window.promote and lkg != target:
            lkg = target
            events.append(
                Note(
                    "Normal",
                    EventReason.BAKED,
                    f"revision {lkg} passed bakeTime {policy.bake_time} "
                    "and is now the last known good revision",
                )
            )
        if blind and not _was(given.conditions, "GuardBlind", "True"):
            events.append(
                Note(
                    "Warning",
                    EventReason.GUARD_BLIND,
                    f"{verdict.message} "
                    f"({window.status.consecutive_errors} source errors in a row)",
                )
            )
    if no_known_good and not _was(given.conditions, "Degraded", "True"):
        events.append(Note("Warning", EventReason.NO_KNOWN_GOOD, no_known_good))
    return GuardDecision(
        target=target,
        guard=guard_status,
        last_known_good=lkg,
        quarantine=quarantine,
        rolled_back=rolled_back,
        blind=blind,
        no_known_good=no_known_good,
        events=events,
        rollbacks=rollbacks,
        ooms=ooms,
        cleared=released,
        blind_cause=snapshot.failing_causes if blind and snapshot is not None else None,
    )

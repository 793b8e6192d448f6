"""One guard evaluation inside a reconcile pass (pure): window bookkeeping, verdict, bake."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dsv4_operator.api.base import parse_duration
from dsv4_operator.api.spec import GuardSpec
from dsv4_operator.guard.observations import Snapshot
from dsv4_operator.guard.oom import OomEvent, oom_events, within
from dsv4_operator.guard.policy import Evidence, Outcome, Verdict, evaluate

Obj = dict[str, Any]


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


@dataclass(frozen=True)
class GuardResult:
    """What the guard concluded about the subject revision in this pass."""

    status: Obj
    verdict: Verdict
    rollback: str | None  # LeakRate | OOM | NoData
    promote: bool
    blind: bool
    ooms: list[OomEvent]


def guard_step(
    guard: GuardSpec,
    previous: Obj,
    snapshot: Snapshot | None,
    pods: list[Obj],
    subject: str,
    baked: bool,
    settled: bool,
    now: datetime,
) -> GuardResult:
    """Evaluate `subject` (the revision being served or rolled out)."""
    same_window = previous.get("revision") == subject
    since = _parse(previous.get("since")) if same_window else now
    passing_since = _parse(previous.get("passingSince")) if same_window else None
    if snapshot is not None and snapshot.revision == subject:
        samples, leaks = snapshot.samples, snapshot.leaks
    elif same_window:
        samples, leaks = int(previous.get("samples", 0)), int(previous.get("leaks", 0))
    else:
        samples, leaks = 0, 0
    errors = snapshot.consecutive_errors if snapshot else 0
    ooms = within(oom_events(pods), subject, now, parse_duration(guard.oom.window))
    evidence = Evidence(
        samples=samples,
        leaks=leaks,
        oom_events=len(ooms),
        baked=baked,
        source_error=snapshot.last_error if snapshot and errors else None,
        prometheus_leak_rate=snapshot.prometheus_leak_rate if snapshot else None,
        prometheus_oom_events=snapshot.prometheus_oom_events if snapshot else None,
    )
    verdict = evaluate(evidence, guard)
    bake = parse_duration(guard.bake_time)
    if (
        verdict.outcome == Outcome.NO_DATA
        and guard.no_data == "Fail"
        and since is not None
        and now - since >= bake
        and settled
    ):
        verdict = Verdict(
            Outcome.FAIL,
            "NoData",
            f"no conclusive canary evidence within bakeTime {guard.bake_time} "
            f"({verdict.message}); noData is Fail",
        )
    rollback = verdict.rollback_reason
    if rollback and verdict.reason == "NoData":
        rollback = "NoData"
    if verdict.outcome == Outcome.PASS and settled:
        passing_since = passing_since or now
    elif verdict.outcome in (Outcome.FAIL, Outcome.ERROR):
        passing_since = None
    promote = bool(
        verdict.outcome == Outcome.PASS
        and settled
        and not ooms
        and passing_since is not None
        and now - passing_since >= bake
    )
    status: Obj = {
        "revision": subject,
        "since": stamp(since or now),
        "samples": samples,
        "leaks": leaks,
        "lastVerdict": verdict.outcome.value,
        "lastReason": verdict.reason,
        "lastMessage": verdict.message,
        "oomEvents": len(ooms),
        "consecutiveErrors": errors,
    }
    if samples:
        status["leakRate"] = round(leaks / samples, 4)
    if snapshot is not None and snapshot.last_run is not None:
        status["lastSampleTime"] = stamp(snapshot.last_run)
    if passing_since is not None:
        status["passingSince"] = stamp(passing_since)
    return GuardResult(status, verdict, rollback, promote, errors >= guard.error_limit, ooms)

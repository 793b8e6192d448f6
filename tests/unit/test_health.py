"""Degraded and status.phase from what a pass saw (reconcile/health.py), as tables."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dsv4_operator.reasons import ConditionReason, WeightsReason
from dsv4_operator.reconcile.health import Fault, Health, find_fault, phase, seconds_to_deadline

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
STEADY = Health(
    complete=False,
    progress_reason=ConditionReason.RECREATING,
    progress_message="stopping the old pair before starting the new format",
    step_since=NOW - timedelta(seconds=30),
    now=NOW,
    deadline_seconds=600,
)


def _with(**changes: Any) -> Health:
    return dataclasses.replace(STEADY, **changes)


IMAGE = ("ImagePullBackOff", "pod x-decode-0 container engine: ImagePullBackOff: Back-off")

FAULTS: dict[str, tuple[Health, str | None, bool]] = {
    # (what the pass saw, the Degraded reason or None for no fault, terminal)
    "a Recreate under way is progress": (STEADY, None, False),
    "a Recreate's router 0/1 is progress": (
        _with(unavailable=("router 0/1 available",)),
        None,
        False,
    ),
    "the deadline not yet passed": (_with(step_since=NOW - timedelta(seconds=599)), None, False),
    "the deadline passed": (
        _with(step_since=NOW - timedelta(seconds=600)),
        ConditionReason.PROGRESS_DEADLINE_EXCEEDED,
        True,
    ),
    "a stuck pod cause": (_with(pod_fault=IMAGE), ConditionReason.IMAGE_PULL_BACK_OFF, False),
    "the deadline outranks a pod cause": (
        _with(pod_fault=IMAGE, step_since=NOW - timedelta(hours=1)),
        ConditionReason.PROGRESS_DEADLINE_EXCEEDED,
        True,
    ),
    "a crash loop": (
        _with(pod_fault=("CrashLoopBackOff", "pod x-router-1 container router: CrashLoopBackOff")),
        ConditionReason.CRASH_LOOP_BACK_OFF,
        False,
    ),
    "a download with figures is progress past the deadline": (
        _with(
            progress_reason=ConditionReason.WAITING_FOR_WEIGHTS,
            weights_reason=WeightsReason.DOWNLOADING,
            step_since=NOW - timedelta(hours=2),
        ),
        None,
        False,
    ),
    "a pending download is held to the deadline": (
        _with(
            progress_reason=ConditionReason.WAITING_FOR_WEIGHTS,
            weights_reason=WeightsReason.PENDING,
            step_since=NOW - timedelta(hours=2),
        ),
        ConditionReason.PROGRESS_DEADLINE_EXCEEDED,
        True,
    ),
    "a download Job that gave up": (
        _with(
            progress_reason=ConditionReason.WAITING_FOR_WEIGHTS,
            weights_reason=WeightsReason.UNAUTHORIZED,
            weights_message="401",
        ),
        ConditionReason.WEIGHTS_FAILED,
        True,
    ),
    "a missing token Secret": (
        _with(
            progress_reason=ConditionReason.WAITING_FOR_WEIGHTS,
            weights_reason=WeightsReason.TOKEN_SECRET_MISSING,
        ),
        ConditionReason.WEIGHTS_FAILED,
        True,
    ),
    "a quarantine with nothing to fall back to": (
        _with(
            progress_reason=ConditionReason.QUARANTINED,
            no_known_good="revision abc fails",
            step_since=NOW - timedelta(hours=2),
        ),
        ConditionReason.NO_KNOWN_GOOD,
        False,
    ),
    "complete and ready": (_with(complete=True, step_since=NOW - timedelta(days=3)), None, False),
    "complete with replicas gone": (
        _with(complete=True, unavailable=("decode 0/1 ready",)),
        ConditionReason.REPLICAS_UNAVAILABLE,
        False,
    ),
}


@pytest.mark.parametrize("case", FAULTS)
def test_a_fault_is_a_fault_and_progress_is_not(case: str) -> None:
    health, reason, terminal = FAULTS[case]
    fault = find_fault(health)
    assert (fault.reason if fault else None) == reason
    if fault is not None:
        assert fault.terminal is terminal and fault.message


def test_the_deadline_message_names_the_step_and_the_cause() -> None:
    fault = find_fault(_with(pod_fault=IMAGE, step_since=NOW - timedelta(seconds=900)))
    assert fault is not None
    assert "no progress for 600s (spec.progressDeadlineSeconds) in Recreating" in fault.message
    assert "ImagePullBackOff" in fault.message


def test_seconds_to_deadline_counts_from_the_step() -> None:
    assert seconds_to_deadline(STEADY) == 570.0
    assert seconds_to_deadline(_with(complete=True)) is None


PHASES: list[tuple[bool, Fault | None, bool, str]] = [
    (False, None, False, "Progressing"),
    (True, None, False, "Ready"),
    (True, None, True, "RolledBack"),
    (False, Fault(ConditionReason.UNSCHEDULABLE, "m"), False, "Degraded"),
    (True, Fault(ConditionReason.REPLICAS_UNAVAILABLE, "m"), True, "Degraded"),
    (False, Fault(ConditionReason.PROGRESS_DEADLINE_EXCEEDED, "m", True), False, "Failed"),
    (False, Fault(ConditionReason.WEIGHTS_FAILED, "m", True), False, "Failed"),
]


@pytest.mark.parametrize(("complete", "fault", "rolled_back", "expected"), PHASES)
def test_phase(complete: bool, fault: Fault | None, rolled_back: bool, expected: str) -> None:
    assert phase(complete, fault, rolled_back) == expected

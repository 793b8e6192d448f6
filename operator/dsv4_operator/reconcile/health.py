"""Whether a deployment is at fault and its phase: the pure decisions behind Degraded and
`status.phase`. A fault is something that does not clear by waiting; a planned rollout
(Recreate included, whose router and roles stop on purpose) is progress, never a fault."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dsv4_operator.api.status import Phase
from dsv4_operator.reasons import ConditionReason, WeightsReason

# WeightsReady reasons that are progress, not failure.
WEIGHTS_UNDER_WAY = frozenset(
    {
        WeightsReason.PENDING,
        WeightsReason.DOWNLOADING,
        WeightsReason.VERIFYING,
        WeightsReason.DOWNLOADED,
    }
)
# WeightsReady reasons whose figures move: the download itself is progress.
WEIGHTS_MOVING = frozenset({WeightsReason.DOWNLOADING, WeightsReason.VERIFYING})


@dataclass(frozen=True)
class Fault:
    """A cause that holds the deployment: the Degraded=True reason and message."""

    reason: ConditionReason
    message: str
    terminal: bool = False  # phase Failed: it stays until someone acts


@dataclass(frozen=True)
class Health:
    """What the pass saw, as the fault decision reads it."""

    complete: bool  # the rollout is done (Progressing=False)
    progress_reason: str
    progress_message: str
    step_since: datetime  # when the current Progressing reason began
    now: datetime
    deadline_seconds: int
    unavailable: tuple[str, ...] = ()  # replicas missing (what each lacks)
    pod_fault: tuple[str, str] | None = None  # (pod_causes.FAULT_CAUSES name, problem)
    weights_reason: str | None = None
    weights_message: str = ""
    no_known_good: str | None = None


def deadline_applies(health: Health) -> bool:
    """The deadline runs while a step waits, except a quarantine (NoKnownGood says it) and a
    download whose figures move (the Job's own retries and deadline bound it)."""
    if health.complete or health.progress_reason == ConditionReason.QUARANTINED:
        return False
    return not (
        health.progress_reason == ConditionReason.WAITING_FOR_WEIGHTS
        and health.weights_reason in WEIGHTS_MOVING
    )


def seconds_to_deadline(health: Health) -> float | None:
    """Seconds until the progress deadline passes (<= 0: passed); None when it does not run."""
    if not deadline_applies(health):
        return None
    stalled = (health.now - health.step_since).total_seconds()
    return health.deadline_seconds - stalled


def find_fault(health: Health) -> Fault | None:
    """The fault that holds, most final first: weights that cannot be had, the deadline, a pod
    cause that does not clear by waiting, no known good to fall back to, replicas missing once
    the rollout is complete. None: no fault (progress or ready)."""
    weights = health.weights_reason
    if weights is not None and weights not in WEIGHTS_UNDER_WAY:
        return Fault(
            ConditionReason.WEIGHTS_FAILED,
            f"weights {weights}: {health.weights_message}",
            terminal=True,
        )
    if health.progress_reason == ConditionReason.GROUPS_UNAVAILABLE:
        return Fault(ConditionReason.GROUPS_UNAVAILABLE, health.progress_message)
    left = seconds_to_deadline(health)
    if left is not None and left <= 0:
        cause = f"; {health.pod_fault[1]}" if health.pod_fault else ""
        return Fault(
            ConditionReason.PROGRESS_DEADLINE_EXCEEDED,
            f"no progress for {health.deadline_seconds}s (spec.progressDeadlineSeconds) in "
            f"{health.progress_reason}: {health.progress_message}{cause}",
            terminal=True,
        )
    if health.pod_fault is not None:
        kind, problem = health.pod_fault
        return Fault(ConditionReason(kind), problem)
    if health.no_known_good:
        return Fault(ConditionReason.NO_KNOWN_GOOD, health.no_known_good)
    if health.complete and health.unavailable:
        return Fault(ConditionReason.REPLICAS_UNAVAILABLE, "; ".join(health.unavailable))
    return None


def no_fault_message(health: Health) -> str:
    """Degraded=False's message: what goes on instead."""
    return f"no fault: {health.progress_message}"


def phase(complete: bool, fault: Fault | None, rolled_back: bool) -> Phase:
    """Failed for a terminal fault, Degraded for another, else Progressing until the rollout
    is complete, then RolledBack or Ready."""
    if fault is not None:
        return "Failed" if fault.terminal else "Degraded"
    if not complete:
        return "Progressing"
    return "RolledBack" if rolled_back else "Ready"

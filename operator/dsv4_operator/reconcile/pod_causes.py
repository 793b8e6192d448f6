"""Why a pod is not ready, read from its status and, when the status says nothing (a pod
stuck in ContainerCreating), from its Warning Events: what a user would otherwise dig out of
`kubectl describe pod` (the scheduler's verdict, image pulls, crashes, OOM kills, mounts)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from dsv4_operator.kube.objects import Obj
from dsv4_operator.names import parse_time
from dsv4_operator.reconcile.world import name_of

MESSAGE_LIMIT = 300
# A pod not ready this long with nothing in its status is worth a look at its Events.
STUCK_AFTER_SECONDS = 10.0
# Waiting reasons that say nothing about a problem: the container is on its way.
_BENIGN_WAITING = frozenset({"ContainerCreating", "PodInitializing"})


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def _with(reason: str, message: str | None) -> str:
    return f"{reason}: {_short(message)}" if message else reason


def _terminated(term: dict[str, Any]) -> str:
    reason = term.get("reason") or "Error"
    detail = f"exit code {term.get('exitCode', '?')}"
    if term.get("message"):
        detail += f", {term['message']}"
    return _with(reason, detail)


def _container_problem(status: dict[str, Any]) -> str | None:
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    last = (status.get("lastState") or {}).get("terminated") or {}
    reason = waiting.get("reason")
    if reason == "CrashLoopBackOff":
        return f"CrashLoopBackOff, last {_terminated(last)}" if last else "CrashLoopBackOff"
    if reason and reason not in _BENIGN_WAITING:
        return _with(reason, waiting.get("message"))
    terminated = state.get("terminated")
    if terminated:
        return _terminated(terminated)
    if last.get("reason") == "OOMKilled":
        return f"restarted after {_terminated(last)}"
    return None


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _event_problem(events: Sequence[Obj]) -> str | None:
    """The newest Warning Event's reason and message (FailedMount, FailedAttachVolume, ...)."""
    warnings = [e for e in events if e.get("type") == "Warning"]
    if not warnings:
        return None
    newest = max(
        warnings,
        key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""),
    )
    return _with(str(newest.get("reason") or "Warning"), newest.get("message"))


def unexplained(pods: Iterable[Obj], now: datetime, limit: int = 3) -> list[str]:
    """Names of pods on a node, not ready for STUCK_AFTER_SECONDS although their status gives
    no cause: only their Events can tell (the kubelet's: FailedMount and the like). At most
    `limit`, by name, to bound the lookups; a pod waiting for a scheduler has none."""
    names = sorted(
        name_of(p)
        for p in pods
        if _scheduled(p)
        and not _ready(p)
        and _status_problem(p) is None
        and _age(p, now) >= STUCK_AFTER_SECONDS
    )
    return names[:limit]


def _scheduled(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "True" for c in conditions)


def _age(pod: Obj, now: datetime) -> float:
    created = parse_time(pod.get("metadata", {}).get("creationTimestamp"))
    return (now - created).total_seconds() if created is not None else 0.0


def pod_problem(pod: Obj, events: Sequence[Obj] = ()) -> str | None:
    """`pod <name>: <cause>` for a pod that is not ready for a reason worth telling, or None
    (ready, or simply starting). `events` are the pod's Events (Warning ones are used when
    the status gives no cause)."""
    if _ready(pod):
        return None
    problem = _status_problem(pod)
    if problem is None:
        cause = _event_problem(events)
        problem = f"pod {name_of(pod)}: {cause}" if cause else None
    return problem


def _status_problem(pod: Obj) -> str | None:
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled", {})
    if scheduled.get("status") == "False":
        cause = _with(scheduled.get("reason") or "NotScheduled", scheduled.get("message"))
        return f"pod {name_of(pod)}: {cause}"
    for container in status.get("containerStatuses") or []:
        problem = _container_problem(container)
        if problem:
            return f"pod {name_of(pod)} container {container.get('name')}: {problem}"
    return None


def first_problem(
    pods: Iterable[Obj], events: Mapping[str, Sequence[Obj]] | None = None
) -> str | None:
    """The first problem among `pods` (by name, so the message is stable between passes);
    `events` maps pod names to their Events."""
    for pod in sorted(pods, key=name_of):
        problem = pod_problem(pod, (events or {}).get(name_of(pod), ()))
        if problem:
            return problem
    return None

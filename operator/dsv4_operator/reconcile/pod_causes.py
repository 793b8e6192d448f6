"""Why a pod is not ready, read from its status: what a user would otherwise dig out of
`kubectl describe pod` (the scheduler's verdict, image pulls, crashes, OOM kills)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dsv4_operator.reconcile.world import Obj, name_of

MESSAGE_LIMIT = 300
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


def pod_problem(pod: Obj) -> str | None:
    """`pod <name>: <cause>` for a pod that is not ready for a reason worth telling, or None
    (ready, or simply starting)."""
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    if conditions.get("Ready", {}).get("status") == "True":
        return None
    scheduled = conditions.get("PodScheduled", {})
    if scheduled.get("status") == "False":
        cause = _with(scheduled.get("reason") or "NotScheduled", scheduled.get("message"))
        return f"pod {name_of(pod)}: {cause}"
    for container in status.get("containerStatuses") or []:
        problem = _container_problem(container)
        if problem:
            return f"pod {name_of(pod)} container {container.get('name')}: {problem}"
    return None


def first_problem(pods: Iterable[Obj]) -> str | None:
    """The first problem among `pods` (by name, so the message is stable between passes)."""
    for pod in sorted(pods, key=name_of):
        problem = pod_problem(pod)
        if problem:
            return problem
    return None

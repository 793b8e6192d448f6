"""Why a pod is not ready, read from its status and, when the status says nothing (a pod
stuck in ContainerCreating), from its Warning Events: what a user would otherwise dig out of
`kubectl describe pod` (the scheduler's verdict, image pulls, crashes, OOM kills, mounts)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from dsv4_operator.kube.objects import Obj
from dsv4_operator.pods import ContainerView, PodView, Terminated
from dsv4_operator.render.engine import GPU_PRODUCT_LABEL

MESSAGE_LIMIT = 300
# How the scheduler says that no node has the labels a pod selects (kube-scheduler's NodeAffinity
# plugin: "N node(s) didn't match Pod's node affinity/selector").
NO_NODE_MATCHED = "didn't match Pod's node affinity/selector"
# A pod not ready this long with nothing in its status is worth a look at its Events.
STUCK_AFTER_SECONDS = 10.0
# How often a stuck pod's Warning Events are listed again: the kubelet may post one later.
EVENTS_REFRESH_SECONDS = 60.0
# Waiting reasons that say nothing about a problem: the container is on its way.
_BENIGN_WAITING = frozenset({"ContainerCreating", "PodInitializing"})


@dataclass(frozen=True)
class PodWarnings:
    """A stuck pod's Warning Events (`unexplained`) and when they were listed: they are listed
    at most once per EVENTS_REFRESH_SECONDS, never watched."""

    listed: datetime
    events: tuple[Obj, ...] = ()


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def _with(reason: str, message: str | None) -> str:
    return f"{reason}: {_short(message)}" if message else reason


def _terminated(term: Terminated) -> str:
    reason = term.reason or "Error"
    detail = f"exit code {'?' if term.exit_code is None else term.exit_code}"
    if term.message:
        detail += f", {term.message}"
    return _with(reason, detail)


def _container_problem(container: ContainerView) -> str | None:
    waiting, last = container.waiting, container.last_terminated
    reason = waiting.reason if waiting is not None else None
    if reason == "CrashLoopBackOff":
        return f"CrashLoopBackOff, last {_terminated(last)}" if last else "CrashLoopBackOff"
    if waiting is not None and reason and reason not in _BENIGN_WAITING:
        return _with(reason, waiting.message)
    if container.terminated is not None:
        return _terminated(container.terminated)
    if last is not None and last.reason == "OOMKilled":
        return f"restarted after {_terminated(last)}"
    return None


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


def unexplained(pods: Iterable[PodView], now: datetime, limit: int = 3) -> list[str]:
    """Names of pods on a node, not ready for STUCK_AFTER_SECONDS although their status gives
    no cause: only their Events can tell (the kubelet's: FailedMount and the like). At most
    `limit`, by name, to bound the lookups; a pod waiting for a scheduler has none."""
    names = sorted(p.name for p in pods if _silent(p) and p.age(now) >= STUCK_AFTER_SECONDS)
    return names[:limit]


def seconds_until_stuck(pods: Iterable[PodView], now: datetime) -> float | None:
    """Seconds until the first pod that is not ready, with no cause in its status, has been so
    for STUCK_AFTER_SECONDS (then `unexplained` names it and its Events are read); None when
    none will. No watch event marks that moment: a pass must be asked for it."""
    waits = [
        STUCK_AFTER_SECONDS - p.age(now)
        for p in pods
        if _silent(p) and p.created is not None and p.age(now) < STUCK_AFTER_SECONDS
    ]
    return max(min(waits), 0.0) if waits else None


def seconds_until_events_due(warnings: Mapping[str, PodWarnings], now: datetime) -> float | None:
    """Seconds until the first of these stuck pods' Events are due to be listed again; None
    when none were listed. A Warning the kubelet posts after a listing (a mount that times out
    after minutes) is marked by no watch event: a pass must be asked for then, or the pod's
    cause waits for a pass that comes for another reason."""
    waits = [EVENTS_REFRESH_SECONDS - (now - w.listed).total_seconds() for w in warnings.values()]
    return max(min(waits), 0.0) if waits else None


def seconds_until_causes_due(
    pods: Iterable[PodView], warnings: Mapping[str, PodWarnings], now: datetime
) -> float | None:
    """When a pass should look again at why these pods are not ready, with `warnings` the
    stuck ones' Events as last listed: a second after the first silent pod turns stuck, or
    after a stuck pod's Events are due again (time for the pass to find it); None for neither."""
    waits = [seconds_until_stuck(pods, now), seconds_until_events_due(warnings, now)]
    due = [wait + 1.0 for wait in waits if wait is not None]
    return min(due) if due else None


def _silent(pod: PodView) -> bool:
    """Scheduled, not ready, and its status says nothing about why."""
    return pod.scheduled and not pod.ready and _status_problem(pod) is None


def pod_problem(pod: PodView, events: Sequence[Obj] = ()) -> str | None:
    """`pod <name>: <cause>` for a pod that is not ready for a reason worth telling, or None
    (ready, or simply starting). `events` are the pod's Events (Warning ones are used when
    the status gives no cause)."""
    if pod.ready:
        return None
    problem = _status_problem(pod)
    if problem is None:
        cause = _event_problem(events)
        problem = f"pod {pod.name}: {cause}" if cause else None
    return problem


def _selector_note(pod: PodView, message: str | None) -> str:
    """When no node matched the pod's selector, what it selects on: the GPU product label the
    operator pins (spec.gpu.product) first, which the scheduler's message does not name."""
    product = pod.node_selector.get(GPU_PRODUCT_LABEL)
    if product is None or NO_NODE_MATCHED not in (message or ""):
        return ""
    others = ", ".join(
        f"{k}={v}" for k, v in sorted(pod.node_selector.items()) if k != GPU_PRODUCT_LABEL
    )
    also = f", and {others}" if others else ""
    return (
        f". The pod needs a node labelled {GPU_PRODUCT_LABEL}={product} (spec.gpu.product){also}; "
        f"`kubectl get nodes -L {GPU_PRODUCT_LABEL}` shows each node's product"
    )


def _status_problem(pod: PodView) -> str | None:
    scheduled = pod.condition("PodScheduled")
    if scheduled is not None and scheduled.status == "False":
        cause = _with(scheduled.reason or "NotScheduled", scheduled.message)
        note = _selector_note(pod, scheduled.message)
        return f"pod {pod.name}: {cause.rstrip('.') if note else cause}{note}"
    for container in pod.containers:
        problem = _container_problem(container)
        if problem:
            return f"pod {pod.name} container {container.name}: {problem}"
    return None


# Causes that do not clear by waiting: each is a fault (Degraded=True) under the name a user
# knows from `kubectl get pods`; ErrImagePull and InvalidImageName read as the image pull they
# are, CreateContainerError as the container config (a missing Secret or ConfigMap key).
FAULT_CAUSES: Mapping[str, str] = {
    "Unschedulable": "Unschedulable",
    "CrashLoopBackOff": "CrashLoopBackOff",
    "ImagePullBackOff": "ImagePullBackOff",
    "ErrImagePull": "ImagePullBackOff",
    "InvalidImageName": "ImagePullBackOff",
    "CreateContainerConfigError": "CreateContainerConfigError",
    "CreateContainerError": "CreateContainerConfigError",
}


def _fault_kind(pod: PodView) -> str | None:
    """The FAULT_CAUSES name of what keeps `pod` from running, None for no fault."""
    if pod.ready:
        return None
    scheduled = pod.condition("PodScheduled")
    if scheduled is not None and scheduled.status == "False":
        return FAULT_CAUSES.get(scheduled.reason or "")
    for container in pod.containers:
        waiting = container.waiting.reason if container.waiting is not None else None
        if waiting is not None and waiting in FAULT_CAUSES:
            return FAULT_CAUSES[waiting]
    return None


def first_fault(pods: Iterable[PodView]) -> tuple[str, str] | None:
    """The first pod (by name) held by a fault: its FAULT_CAUSES name and its problem as
    pod_problem tells it; None when every pod runs or is only on its way."""
    for pod in sorted(pods, key=lambda p: p.name):
        kind = _fault_kind(pod)
        problem = _status_problem(pod) if kind else None
        if kind and problem:
            return kind, problem
    return None


def first_problem(
    pods: Iterable[PodView], warnings: Mapping[str, PodWarnings] | None = None
) -> str | None:
    """The first problem among `pods` (by name, so the message is stable between passes);
    `warnings`: the stuck ones' Events, by pod name."""
    for pod in sorted(pods, key=lambda p: p.name):
        listed = (warnings or {}).get(pod.name)
        problem = pod_problem(pod, listed.events if listed is not None else ())
        if problem:
            return problem
    return None

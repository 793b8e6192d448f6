"""OOM signals from pods (pure): OOMKilled terminations and CUDA OOM / pool-sizing log lines.

Engine containers use terminationMessagePolicy FallbackToLogsOnError, so the kubelet copies
the log tail of a failed container into its termination message: the CUDA OOM and
"Not enough memory" signatures of docs/engine-notes.md are read from there, no log API call needed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from dsv4_operator.api.roles import ROLES
from dsv4_operator.api.status import GroupRestart
from dsv4_operator.names import LWS_GROUP_INDEX_LABEL
from dsv4_operator.pods import PodView, Terminated

# docs/engine-notes.md: how memory failures show up
SIGNATURES: tuple[tuple[str, str], ...] = (
    ("CUDA out of memory", "CudaOOM"),
    ("OutOfMemoryError", "CudaOOM"),
    ("Not enough memory. Please try to increase --mem-fraction-static", "NotEnoughMemory"),
    ("Prefill out of memory", "PrefillOOM"),
)


@dataclass(frozen=True)
class OomEvent:
    """One container termination caused by memory, attributed to a revision and role."""

    pod: str
    role: str
    revision: str
    kind: str  # OOMKilled | CudaOOM | NotEnoughMemory | PrefillOOM
    at: datetime
    key: str  # stable identity: pod uid + container restart


def _kind(terminated: Terminated) -> str | None:
    return _kind_of(terminated.reason, terminated.message)


def _kind_of(reason: str | None, message: str | None) -> str | None:
    if reason == "OOMKilled":
        return "OOMKilled"
    message = str(message or "")
    for needle, kind in SIGNATURES:
        if needle in message:
            return kind
    return None


def oom_events(pods: Iterable[PodView], restarts: Iterable[GroupRestart] = ()) -> list[OomEvent]:
    """Every memory-caused termination the pods still report (current or last state), and
    one per restart of a multi-node group whose pods said so: a group counts once, whichever
    of its pods ran out of memory (a worker's OOM is its group's, and every rank of a group
    often fails together), and its pods are gone once it restarts."""
    events: dict[str, OomEvent] = {}
    for restart in restarts:
        kinds = [k for p in restart.pods if (k := _kind_of(p.reason, p.message)) is not None]
        if kinds and restart.role in ROLES and restart.revision:
            key = f"group/{restart.key}"
            events[key] = OomEvent(
                restart.group, restart.role, restart.revision, kinds[0], restart.at.at, key
            )
    for pod in pods:
        role, revision = pod.role, pod.revision
        if role not in ROLES or not revision or LWS_GROUP_INDEX_LABEL in pod.labels:
            continue  # a group's pods count through its restarts above
        for container in pod.containers:
            for terminated in (container.terminated, container.last_terminated):
                if terminated is None:
                    continue
                kind = _kind(terminated)
                if kind is None or terminated.finished is None:
                    continue
                key = f"{pod.uid}/{container.name}/{terminated.finished}"
                events[key] = OomEvent(
                    pod.name, str(role), str(revision), kind, terminated.finished.at, key
                )
    return sorted(events.values(), key=lambda e: e.at)


def within(
    events: list[OomEvent], revision: str, now: datetime, window: timedelta
) -> list[OomEvent]:
    return [e for e in events if e.revision == revision and now - e.at <= window]

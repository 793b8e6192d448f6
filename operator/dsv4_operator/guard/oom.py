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
    if terminated.reason == "OOMKilled":
        return "OOMKilled"
    message = str(terminated.message or "")
    for needle, kind in SIGNATURES:
        if needle in message:
            return kind
    return None


def oom_events(pods: Iterable[PodView]) -> list[OomEvent]:
    """Every memory-caused termination the pods still report (current or last state)."""
    events: dict[str, OomEvent] = {}
    for pod in pods:
        role, revision = pod.role, pod.revision
        if role not in ROLES or not revision:
            continue
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

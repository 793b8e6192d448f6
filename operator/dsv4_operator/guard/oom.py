"""OOM signals from pods (pure): OOMKilled terminations and CUDA OOM / pool-sizing log lines.

Engine containers use terminationMessagePolicy FallbackToLogsOnError, so the kubelet copies
the log tail of a failed container into its termination message: the CUDA OOM and
"Not enough memory" signatures of docs/engine-notes.md are read from there, no log API call needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dsv4_operator.api.roles import ROLES
from dsv4_operator.names import REVISION_LABEL, ROLE_LABEL, parse_time

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


def _kind(terminated: dict[str, Any]) -> str | None:
    if terminated.get("reason") == "OOMKilled":
        return "OOMKilled"
    message = str(terminated.get("message") or "")
    for needle, kind in SIGNATURES:
        if needle in message:
            return kind
    return None


def oom_events(pods: list[dict[str, Any]]) -> list[OomEvent]:
    """Every memory-caused termination the pods still report (current or last state)."""
    events: dict[str, OomEvent] = {}
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels") or {}
        role, revision = labels.get(ROLE_LABEL), labels.get(REVISION_LABEL)
        if role not in ROLES or not revision:
            continue
        for status in pod.get("status", {}).get("containerStatuses") or []:
            for state_key in ("state", "lastState"):
                terminated = (status.get(state_key) or {}).get("terminated")
                if not terminated:
                    continue
                kind = _kind(terminated)
                at = parse_time(terminated.get("finishedAt"))
                if kind is None or at is None:
                    continue
                uid, container = pod["metadata"].get("uid"), status.get("name")
                key = f"{uid}/{container}/{terminated.get('finishedAt')}"
                events[key] = OomEvent(
                    pod["metadata"]["name"], str(role), str(revision), kind, at, key
                )
    return sorted(events.values(), key=lambda e: e.at)


def within(
    events: list[OomEvent], revision: str, now: datetime, window: timedelta
) -> list[OomEvent]:
    return [e for e in events if e.revision == revision and now - e.at <= window]

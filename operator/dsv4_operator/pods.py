"""Pods as the operator reads them: a typed view built once from the API server's object (pure).

The guard's OOM reading (guard/oom.py) and the reconcile's pod causes and readiness read
these fields instead of dict paths. A pod is never written back, so the view keeps no raw
object; and it lives outside kube/ because the guard, which is pure, reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dsv4_operator.api.times import Timestamp
from dsv4_operator.names import LWS_WORKER_INDEX_LABEL, PAIR_LABEL, REVISION_LABEL, ROLE_LABEL

# The fields of a pod's spec that `PodView` reads. Every reader of a cached pod goes through
# PodView, so the watch cache keeps only these of a pod's spec (runtime/watched.py): the
# containers, volumes and tolerations were three fifths of a cached pod, about 20 KB per
# deployment. A field PodView comes to read must be named here.
POD_SPEC_FIELDS_READ = ("nodeSelector",)


def _time(text: Any) -> Timestamp | None:
    """A time the API server wrote (an RFC 3339 string), None when there is none."""
    return Timestamp(text) if text else None


@dataclass(frozen=True)
class Terminated:
    """A container's `terminated` state (current or last): how and when it ended."""

    reason: str | None
    message: str | None
    exit_code: int | None
    finished: Timestamp | None  # finishedAt, as written (it identifies the termination)

    @classmethod
    def of(cls, state: Mapping[str, Any] | None) -> Terminated | None:
        """None for no termination (absent or empty, as the kubelet leaves it)."""
        terminated = (state or {}).get("terminated")
        if not terminated:
            return None
        return cls(
            reason=terminated.get("reason"),
            message=terminated.get("message"),
            exit_code=terminated.get("exitCode"),
            finished=_time(terminated.get("finishedAt")),
        )


@dataclass(frozen=True)
class Waiting:
    """A container's `waiting` state: why it does not run (yet)."""

    reason: str | None
    message: str | None


@dataclass(frozen=True)
class ContainerView:
    """One entry of `status.containerStatuses`."""

    name: str | None
    restart_count: int
    waiting: Waiting | None
    terminated: Terminated | None  # state.terminated
    last_terminated: Terminated | None  # lastState.terminated

    @classmethod
    def of(cls, status: Mapping[str, Any]) -> ContainerView:
        state = status.get("state") or {}
        waiting = state.get("waiting")
        return cls(
            name=status.get("name"),
            restart_count=int(status.get("restartCount") or 0),
            waiting=Waiting(waiting.get("reason"), waiting.get("message")) if waiting else None,
            terminated=Terminated.of(state),
            last_terminated=Terminated.of(status.get("lastState")),
        )


@dataclass(frozen=True)
class PodCondition:
    """One entry of `status.conditions`."""

    type: str | None
    status: str | None
    reason: str | None
    message: str | None


@dataclass(frozen=True)
class PodView:
    """What the operator reads of a pod."""

    name: str
    uid: str | None
    labels: Mapping[str, str]
    created: Timestamp | None
    phase: str | None
    ip: str | None
    conditions: tuple[PodCondition, ...]
    containers: tuple[ContainerView, ...]
    node_selector: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodView:
        """The view of a pod object as the API server returns it."""
        meta = pod["metadata"]
        status = pod.get("status") or {}
        return cls(
            name=str(meta["name"]),
            uid=meta.get("uid"),
            labels=dict(meta.get("labels") or {}),
            created=_time(meta.get("creationTimestamp")),
            phase=status.get("phase"),
            ip=status.get("podIP"),
            conditions=tuple(
                PodCondition(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
                for c in status.get("conditions") or []
            ),
            containers=tuple(ContainerView.of(c) for c in status.get("containerStatuses") or []),
            node_selector=dict((pod.get("spec") or {}).get("nodeSelector") or {}),
        )

    @property
    def role(self) -> str | None:
        return self.labels.get(ROLE_LABEL)

    @property
    def revision(self) -> str | None:
        return self.labels.get(REVISION_LABEL)

    @property
    def pair(self) -> str | None:
        return self.labels.get(PAIR_LABEL)

    @property
    def worker_index(self) -> int:
        """Its place in a multi-node group: 0 for the leader, and for a single-node pod."""
        value = self.labels.get(LWS_WORKER_INDEX_LABEL, "0")
        return int(value) if value.isdigit() else 0

    def condition(self, type_: str) -> PodCondition | None:
        """The condition of that type (the last one listed, should there be two)."""
        return next((c for c in reversed(self.conditions) if c.type == type_), None)

    def _true(self, type_: str) -> bool:
        return any(c.type == type_ and c.status == "True" for c in self.conditions)

    @property
    def ready(self) -> bool:
        return self._true("Ready")

    @property
    def scheduled(self) -> bool:
        return self._true("PodScheduled")

    def age(self, now: datetime) -> float:
        """Seconds since the pod was created (0 when the API server has not said)."""
        return (now - self.created.at).total_seconds() if self.created is not None else 0.0

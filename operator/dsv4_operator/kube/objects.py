"""Kubernetes objects as the API server sends and takes them: `Obj`, the one alias for one, and
typed views of the children a reconcile reads (StatefulSet, Deployment, ControllerRevision).

A view is built once, when the world is gathered; decisions read its fields. It keeps the
object it was built from (`raw`) for what goes back to the API server as it is: the
server-side apply diff and the owner checks. Pods have their view in pods.py (the pure guard
reads it); Services, PodDisruptionBudgets, ServiceMonitors, the weights objects and Events are
read in one place each, by name and labels, and stay objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4_operator.names import (
    FORMAT_LABEL,
    MAIN_PAIR,
    PAIR_LABEL,
    REVISION_LABEL,
    ROLE_LABEL,
    TARGET_PAIR_ANNOTATION,
)

# An object as JSON (metadata, spec, status ...): what the client returns and applies.
Obj = dict[str, Any]


def labels_of(obj: Obj) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("annotations") or {})


def name_of(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _replicas(obj: Obj) -> int | None:
    replicas = obj.get("spec", {}).get("replicas")
    return None if replicas is None else int(replicas)


def _status(obj: Obj, key: str) -> int:
    return int(obj.get("status", {}).get(key, 0))


def _rolled_out(obj: Obj, ready: str) -> bool:
    """The controller has seen the current spec, and every wanted replica (spec.replicas,
    1 when unset) runs it and counts in `ready` (readyReplicas, availableReplicas)."""
    want = _replicas(obj)
    want = 1 if want is None else want
    seen = _status(obj, "observedGeneration") >= int(obj["metadata"].get("generation", 1))
    return seen and all(_status(obj, key) == want for key in ("updatedReplicas", ready, "replicas"))


@dataclass(frozen=True)
class StatefulSetView:
    """An engine workload: one role of one prefill/decode pair. A StatefulSet, or for a role
    whose replica spans nodes a LeaderWorkerSet, whose replicas are groups: `ready` counts
    the groups whose leader is ready and every worker runs (the LWS controller's count)."""

    raw: Obj
    kind: str  # StatefulSet or LeaderWorkerSet
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    replicas: int | None  # spec.replicas; None when unset (the API server sets it: 1)
    ready: int  # status.readyReplicas
    rolled: bool  # every replica runs the current template and is ready

    @classmethod
    def of(cls, sts: Obj) -> StatefulSetView:
        status = sts.get("status", {})
        # ... and no pod is left on an older revision of the template.
        # (A LeaderWorkerSet has neither field: its updatedReplicas say the same.)
        current = status.get("currentRevision") == status.get("updateRevision")
        return cls(
            raw=sts,
            kind=str(sts.get("kind") or "StatefulSet"),
            name=name_of(sts),
            labels=labels_of(sts),
            annotations=annotations_of(sts),
            replicas=_replicas(sts),
            ready=_status(sts, "readyReplicas"),
            rolled=_rolled_out(sts, "readyReplicas") and current,
        )

    @property
    def role(self) -> str | None:
        return self.labels.get(ROLE_LABEL)

    @property
    def pair(self) -> str:
        return self.labels.get(PAIR_LABEL, MAIN_PAIR)

    @property
    def revision(self) -> str | None:
        return self.labels.get(REVISION_LABEL)

    @property
    def format(self) -> str:
        """The P/D transfer-format key its engines speak."""
        return self.annotations.get(FORMAT_LABEL, "")


@dataclass(frozen=True)
class DeploymentView:
    """A Deployment the operator owns: the router."""

    raw: Obj
    name: str
    annotations: dict[str, str]
    replicas: int | None  # spec.replicas; None when unset (the API server sets it: 1)
    available: int  # status.availableReplicas
    rolled: bool  # the new ReplicaSet is fully available and no old pod remains

    @classmethod
    def of(cls, dep: Obj) -> DeploymentView:
        return cls(
            raw=dep,
            name=name_of(dep),
            annotations=annotations_of(dep),
            replicas=_replicas(dep),
            available=_status(dep, "availableReplicas"),
            rolled=_rolled_out(dep, "availableReplicas"),
        )

    @property
    def target_pair(self) -> str | None:
        """The prefill/decode pair the router's arguments target."""
        return self.annotations.get(TARGET_PAIR_ANNOTATION)


@dataclass(frozen=True)
class RevisionView:
    """A ControllerRevision: the spec one revision was rendered from, numbered."""

    raw: Obj
    name: str
    hash: str  # the revision (config hash) it stores
    number: int
    spec: Obj  # data.spec, as stored

    @classmethod
    def of(cls, revision: Obj) -> RevisionView:
        return cls(
            raw=revision,
            name=name_of(revision),
            hash=str(labels_of(revision).get(REVISION_LABEL, "")),
            number=int(revision.get("revision", 0)),
            spec=revision.get("data", {}).get("spec", {}),
        )

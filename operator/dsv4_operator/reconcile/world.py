"""The facts one reconcile pass decides on, gathered from the API server.

The owner's spec and status arrive as models (parsed once, in gather); the children stay
the plain objects the API server returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from dsv4_operator.api.roles import ROLES, Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.engine.validation import Validation
from dsv4_operator.guard.observations import Snapshot
from dsv4_operator.kube.objects import Obj
from dsv4_operator.names import (
    FORMAT_LABEL,
    MAIN_PAIR,
    PAIR_LABEL,
    REVISION_LABEL,
    ROLE_LABEL,
    TARGET_PAIR_ANNOTATION,
    router_name,
)


def labels_of(obj: Obj) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("annotations") or {})


def name_of(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def statefulset_rolled(sts: Obj) -> bool:
    """Every replica runs the current template and is ready."""
    spec, status = sts.get("spec", {}), sts.get("status", {})
    want = int(spec.get("replicas", 1))
    return (
        int(status.get("observedGeneration", 0)) >= int(sts["metadata"].get("generation", 1))
        and int(status.get("updatedReplicas", 0)) == want
        and int(status.get("readyReplicas", 0)) == want
        and int(status.get("replicas", 0)) == want
        and status.get("currentRevision") == status.get("updateRevision")
    )


def deployment_rolled(dep: Obj) -> bool:
    """The new ReplicaSet is fully available and no old pod remains."""
    spec, status = dep.get("spec", {}), dep.get("status", {})
    want = int(spec.get("replicas", 1))
    return (
        int(status.get("observedGeneration", 0)) >= int(dep["metadata"].get("generation", 1))
        and int(status.get("updatedReplicas", 0)) == want
        and int(status.get("availableReplicas", 0)) == want
        and int(status.get("replicas", 0)) == want
    )


@dataclass(frozen=True)
class Pair:
    """A live prefill/decode pair: the StatefulSets that share one pair label."""

    id: str
    statefulsets: dict[Role, Obj]

    def revision(self, role: Role) -> str | None:
        sts = self.statefulsets.get(role)
        return labels_of(sts).get(REVISION_LABEL) if sts else None

    @property
    def formats(self) -> set[str]:
        return {annotations_of(s).get(FORMAT_LABEL, "") for s in self.statefulsets.values()}

    @property
    def complete(self) -> bool:
        return all(role in self.statefulsets for role in ROLES)

    def rolled(self, role: Role) -> bool:
        sts = self.statefulsets.get(role)
        return sts is not None and statefulset_rolled(sts)


@dataclass(frozen=True)
class World:
    """Everything decide() reads. Built by gather(); tests build it by hand."""

    name: str
    namespace: str
    uid: str
    generation: int
    # The spec, validated once: the model, the findings and the memory plan (when valid).
    validation: Validation
    status: DSV4DeploymentStatus  # the previous status (the guard's durable memory)
    now: datetime
    statefulsets: list[Obj] = field(default_factory=list)
    deployments: list[Obj] = field(default_factory=list)
    services: list[Obj] = field(default_factory=list)
    pdbs: list[Obj] = field(default_factory=list)
    service_monitors: list[Obj] = field(default_factory=list)
    revisions: list[Obj] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)
    # Weights from the Hub (render/weights.py): claim, download Jobs and their pods, the
    # Jobs' rights; each with its kind.
    weights: list[Obj] = field(default_factory=list)
    # Warning Events of pods whose status explains nothing (pod_causes.unexplained), by name.
    pod_events: dict[str, list[Obj]] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    canary: Snapshot | None = None
    # Whether the API server serves ServiceMonitor (the prometheus-operator CRDs).
    monitoring_served: bool = True

    @property
    def spec(self) -> DSV4DeploymentSpec | None:
        """The parsed spec; None when it does not even parse."""
        return self.validation.spec

    def live(self, kind: str, name: str) -> Obj | None:
        pools = {
            "StatefulSet": self.statefulsets,
            "Deployment": self.deployments,
            "Service": self.services,
            "PodDisruptionBudget": self.pdbs,
            "ServiceMonitor": self.service_monitors,
            "ControllerRevision": self.revisions,
        }
        pool = pools.get(kind)
        if pool is None:
            pool = [o for o in self.weights if o.get("kind") == kind]
        return next((o for o in pool if name_of(o) == name), None)

    def weights_objects(self, kind: str) -> list[Obj]:
        return [o for o in self.weights if o.get("kind") == kind]

    def pairs(self) -> dict[str, Pair]:
        grouped: dict[str, dict[Role, Obj]] = {}
        for sts in self.statefulsets:
            lab = labels_of(sts)
            for role in ROLES:
                if lab.get(ROLE_LABEL) == role:
                    grouped.setdefault(lab.get(PAIR_LABEL, MAIN_PAIR), {})[role] = sts
        return {pid: Pair(pid, members) for pid, members in grouped.items()}

    def active_pair_id(self) -> str | None:
        """The pair the router targets; else the only pair; else `main` if present."""
        pairs = self.pairs()
        router = self.live("Deployment", router_name(self.name))
        if router is not None:
            target = annotations_of(router).get(TARGET_PAIR_ANNOTATION)
            if target is not None and target in pairs:
                return target
        if len(pairs) == 1:
            return next(iter(pairs))
        return MAIN_PAIR if MAIN_PAIR in pairs else None

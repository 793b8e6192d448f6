"""The facts one reconcile pass decides on, gathered from the API server.

The owner's spec and status arrive as models (parsed once, in gather); the children it reads
arrive as typed views (kube/objects.py, pods.py), built once from the objects the API server
returned, which they keep for what goes back as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dsv4_operator.api.roles import ROLES, Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus, GroupRestart
from dsv4_operator.engine.validation import Validation
from dsv4_operator.guard.observations import Snapshot
from dsv4_operator.kube.objects import (
    DeploymentView,
    Obj,
    RevisionView,
    StatefulSetView,
    name_of,
)
from dsv4_operator.kube.resources import WORKLOADS
from dsv4_operator.names import MAIN_PAIR, router_name
from dsv4_operator.pods import PodView
from dsv4_operator.reconcile.pod_causes import PodWarnings


@dataclass(frozen=True)
class Pair:
    """A live prefill/decode pair: the StatefulSets that share one pair label."""

    id: str
    statefulsets: dict[Role, StatefulSetView]

    def revision(self, role: Role) -> str | None:
        sts = self.statefulsets.get(role)
        return sts.revision if sts else None

    @property
    def formats(self) -> set[str]:
        return {s.format for s in self.statefulsets.values()}

    @property
    def complete(self) -> bool:
        return all(role in self.statefulsets for role in ROLES)

    def rolled(self, role: Role) -> bool:
        sts = self.statefulsets.get(role)
        return sts is not None and sts.rolled


@dataclass(frozen=True)
class World:
    """Everything decide() reads. Built by gather() through `from_objects`, as are the
    tests' worlds (tests/support/builders.py)."""

    name: str
    namespace: str
    uid: str
    generation: int
    # The spec, validated once: the model, the findings and the memory plan (when valid).
    validation: Validation
    status: DSV4DeploymentStatus  # the previous status (the guard's durable memory)
    now: datetime
    # The engine workloads: StatefulSets and (multi-node roles) LeaderWorkerSets.
    statefulsets: list[StatefulSetView] = field(default_factory=list)
    deployments: list[DeploymentView] = field(default_factory=list)
    services: list[Obj] = field(default_factory=list)
    pdbs: list[Obj] = field(default_factory=list)
    service_monitors: list[Obj] = field(default_factory=list)
    revisions: list[RevisionView] = field(default_factory=list)
    pods: list[PodView] = field(default_factory=list)  # the engines' and the router's
    # The DSV4Model whose weights the spec uses (docs/models.md), with its kind; not a child.
    weights: list[Obj] = field(default_factory=list)
    # Warning Events of pods whose status explains nothing (pod_causes.unexplained), by name,
    # with when they were listed (at most once a minute).
    pod_events: dict[str, PodWarnings] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    canary: Snapshot | None = None
    # Whether the API server serves ServiceMonitor (the prometheus-operator CRDs).
    monitoring_served: bool = True
    # Whether the API server serves LeaderWorkerSet (the LWS CRDs): multi-node roles need it.
    groups_served: bool = True
    # Group restarts the watch saw and status lacks (reconcile/group_capture.py): their pods
    # may be gone before this pass.
    captured_restarts: tuple[GroupRestart, ...] = ()

    @classmethod
    def from_objects(
        cls,
        *,
        statefulsets: Iterable[Obj] = (),
        deployments: Iterable[Obj] = (),
        revisions: Iterable[Obj] = (),
        pods: Iterable[Obj] = (),
        **facts: Any,
    ) -> World:
        """The world of these objects as the API server returns them: the children a
        decision reads become views once, here."""
        return cls(
            statefulsets=[StatefulSetView.of(o) for o in statefulsets],
            deployments=[DeploymentView.of(o) for o in deployments],
            revisions=[RevisionView.of(o) for o in revisions],
            pods=[PodView.of(o) for o in pods],
            **facts,
        )

    @property
    def spec(self) -> DSV4DeploymentSpec | None:
        """The parsed spec; None when it does not even parse."""
        return self.validation.spec

    def live(self, kind: str, name: str) -> Obj | None:
        """The object of that kind and name as the API server holds it (what an apply is
        compared with), or None."""
        if kind in WORKLOADS:  # an engine StatefulSet or LeaderWorkerSet, never both
            return next(
                (v.raw for v in self.statefulsets if (v.kind, v.name) == (kind, name)), None
            )
        views: dict[str, list[DeploymentView] | list[RevisionView]] = {
            "Deployment": self.deployments,
            "ControllerRevision": self.revisions,
        }
        if kind in views:
            return next((v.raw for v in views[kind] if v.name == name), None)
        pools = {
            "Service": self.services,
            "PodDisruptionBudget": self.pdbs,
            "ServiceMonitor": self.service_monitors,
        }
        pool = pools.get(kind)
        if pool is None:
            pool = self.weights_objects(kind)
        return next((o for o in pool if name_of(o) == name), None)

    def weights_objects(self, kind: str) -> list[Obj]:
        return [o for o in self.weights if o.get("kind") == kind]

    def router(self) -> DeploymentView | None:
        """The router Deployment, if it exists."""
        name = router_name(self.name)
        return next((d for d in self.deployments if d.name == name), None)

    def revision(self, name: str) -> RevisionView | None:
        """The ControllerRevision of that name, if it exists."""
        return next((r for r in self.revisions if r.name == name), None)

    def pairs(self) -> dict[str, Pair]:
        grouped: dict[str, dict[Role, StatefulSetView]] = {}
        for sts in self.statefulsets:
            for role in ROLES:
                if sts.role == role:
                    grouped.setdefault(sts.pair, {})[role] = sts
        return {pid: Pair(pid, members) for pid, members in grouped.items()}

    def active_pair_id(self) -> str | None:
        """The pair the router targets; else the only pair; else `main` if present."""
        pairs = self.pairs()
        router = self.router()
        if router is not None:
            target = router.target_pair
            if target is not None and target in pairs:
                return target
        if len(pairs) == 1:
            return next(iter(pairs))
        return MAIN_PAIR if MAIN_PAIR in pairs else None

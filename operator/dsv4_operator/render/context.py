"""What every child builder reads: names, labels, the plan and the launches, computed once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsv4_operator.api.limits import ENGINE_PORT
from dsv4_operator.api.roles import ROLES, Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import effective_role, gpus_needed
from dsv4_operator.engine.flags import Launch, engine_launch, router_launch, served_name
from dsv4_operator.engine.planner import MemoryPlan, plan
from dsv4_operator.engine.topology import nodes_per_replica
from dsv4_operator.names import (
    APP_NAME,
    COMPONENT_LABEL,
    DEFAULT_OPERATOR_IMAGE,
    DEPLOYMENT_LABEL,
    INSTANCE_LABEL,
    LWS_WORKER_INDEX_LABEL,
    MAIN_PAIR,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    PAIR_LABEL,
    ROLE_LABEL,
    child_name,
)
from dsv4_operator.revisions.hashing import config_hash, transfer_format_key

Manifest = dict[str, Any]


@dataclass(frozen=True)
class OwnerRef:
    """The DSV4Deployment that owns the children (garbage collection, `kubectl tree`)."""

    api_version: str
    kind: str
    name: str
    uid: str

    def as_dict(self) -> Manifest:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class RenderContext:
    """Inputs of one render, with derived names and hashes."""

    name: str
    namespace: str
    spec: DSV4DeploymentSpec
    plan: MemoryPlan
    launches: dict[Role, Launch]
    gpus: dict[Role, int]
    revision: str
    transfer_format: str
    owner: OwnerRef | None = None
    # Which prefill/decode pair the engine objects belong to: "main" (plain names) or, for a
    # BlueGreen switch, the revision hash (names suffixed with it).
    pair: str = MAIN_PAIR
    # The operator's image: the weights download Job and the leak tap sidecar run it.
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    # Nodes one replica of a role spans; a role missing here fits on one node (a StatefulSet).
    nodes: dict[Role, int] = field(default_factory=dict)

    def nodes_of(self, role: Role) -> int:
        """Nodes one replica of `role` spans: more than one makes it a LeaderWorkerSet group."""
        return self.nodes.get(role, 1)

    def multi_node(self, role: Role | str) -> bool:
        return role in ROLES and self.nodes_of(role) > 1

    def gpus_per_pod(self, role: Role) -> int:
        """GPUs each pod of a role holds: all of a replica's, or one node's share of them."""
        return self.gpus[role] // self.nodes_of(role)

    def role_name(self, role: Role | str) -> str:
        """Engine objects carry the pair suffix; the router is one per deployment."""
        return child_name(self.name, role, self.pair if role in ROLES else MAIN_PAIR)

    def engine_urls(self, role: Role) -> list[str]:
        """Stable per-pod DNS names of a StatefulSet behind its headless Service."""
        svc = self.role_name(role)
        return [
            f"http://{svc}-{i}.{svc}.{self.namespace}.svc:{ENGINE_PORT}"
            for i in range(self.spec.role(role).replicas)
        ]

    def labels(self, component: str | None = None) -> dict[str, str]:
        labels = {
            NAME_LABEL: APP_NAME,
            INSTANCE_LABEL: self.name,
            MANAGED_BY_LABEL: MANAGED_BY,
            DEPLOYMENT_LABEL: self.name,
        }
        if component is not None:
            labels[COMPONENT_LABEL] = component
            labels[ROLE_LABEL] = component
        return labels

    def selector(self, component: str) -> dict[str, str]:
        selector = {DEPLOYMENT_LABEL: self.name, ROLE_LABEL: component}
        if component in ROLES:  # pairs must never select each other's pods
            selector[PAIR_LABEL] = self.pair
        return selector

    def service_selector(self, role: Role) -> dict[str, str]:
        """The pods a role's Service targets: a group's leader only (it alone serves HTTP)."""
        selector = self.selector(role)
        if self.multi_node(role):
            selector[LWS_WORKER_INDEX_LABEL] = "0"
        return selector

    def metadata(self, name: str, component: str | None = None) -> Manifest:
        labels = self.labels(component)
        if component in ROLES:
            labels[PAIR_LABEL] = self.pair
        meta: Manifest = {"name": name, "namespace": self.namespace, "labels": labels}
        if self.owner is not None:
            meta["ownerReferences"] = [self.owner.as_dict()]
        return meta


def build_context(
    name: str,
    namespace: str,
    spec: DSV4DeploymentSpec,
    owner: OwnerRef | None = None,
    pair: str = MAIN_PAIR,
    memory_plan: MemoryPlan | None = None,
) -> RenderContext:
    """Plan and launch lines for a spec (assumed validated: profiles resolve).

    `memory_plan` is the spec's plan when the caller already has it (validation computed it).
    """
    the_plan = memory_plan or plan(spec)
    served = served_name(spec, the_plan.profiles.model.served_name)
    launches = {role: engine_launch(spec, the_plan, role, served) for role in ROLES}
    gpus = {role: gpus_needed(effective_role(spec, role)) for role in ROLES}
    nodes = {role: nodes_per_replica(spec, role) for role in ROLES}
    return RenderContext(
        name=name,
        namespace=namespace,
        spec=spec,
        plan=the_plan,
        launches=launches,
        gpus=gpus,
        revision=config_hash(spec.engine.image, dict(launches), dict(gpus)),
        transfer_format=transfer_format_key(spec),
        owner=owner,
        pair=pair,
        nodes={role: n for role, n in nodes.items() if n > 1},
    )


def router_command(ctx: RenderContext) -> Launch:
    return router_launch(ctx.spec, ctx.engine_urls("prefill"), ctx.engine_urls("decode"))

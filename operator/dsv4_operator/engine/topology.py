"""How one role replica lies on nodes: GPUs per replica, nodes per replica, GPUs per pod."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsv4_operator.api.limits import DIST_INIT_PORT
from dsv4_operator.api.roles import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import EffectiveRole, effective_role, gpus_needed

__all__ = [
    "DIST_INIT_PORT",
    "RoleTopology",
    "dist_init_addr",
    "gpus_per_pod",
    "nodes_per_replica",
    "role_topology",
    "topology_of",
]


@dataclass(frozen=True)
class RoleTopology:
    """One replica of a role: its GPUs, the nodes they span and each pod's share."""

    gpus_per_replica: int
    nodes: int
    gpus_per_pod: int

    @property
    def multi_node(self) -> bool:
        """Whether a replica is a group of pods (leader + workers) rather than one pod."""
        return self.nodes > 1

    @property
    def spans_whole_nodes(self) -> bool:
        """A multi-node replica must fill every node: sglang gives each node the same number
        of ranks (tp_size * pp_size // nnodes GPUs per node, server_args.py)."""
        return self.nodes == 1 or self.gpus_per_replica == self.nodes * self.gpus_per_pod


def topology_of(eff: EffectiveRole, gpus_per_node: int) -> RoleTopology:
    """The topology of one role from its effective engine configuration.

    A replica that fits one node is one pod with all its GPUs. A larger one spans
    ceil(gpus / perNode) nodes with perNode GPUs each; when the GPUs do not fill whole nodes
    the topology says so (`spans_whole_nodes`) and DSV4-R007 refuses the spec.
    """
    gpus = gpus_needed(eff)
    if gpus <= gpus_per_node:
        return RoleTopology(gpus_per_replica=gpus, nodes=1, gpus_per_pod=gpus)
    return RoleTopology(
        gpus_per_replica=gpus, nodes=math.ceil(gpus / gpus_per_node), gpus_per_pod=gpus_per_node
    )


def role_topology(spec: DSV4DeploymentSpec, role: Role) -> RoleTopology:
    """The topology of `role` in `spec`."""
    return topology_of(effective_role(spec, role), spec.gpu.per_node)


def nodes_per_replica(spec: DSV4DeploymentSpec, role: Role) -> int:
    """Nodes one replica of `role` spans: the LeaderWorkerSet group size and sglang --nnodes."""
    return role_topology(spec, role).nodes


def gpus_per_pod(spec: DSV4DeploymentSpec, role: Role) -> int:
    """nvidia.com/gpu of each pod of `role` (leader and workers alike)."""
    return role_topology(spec, role).gpus_per_pod


def dist_init_addr(leader_host: str) -> str:
    """sglang --dist-init-addr for a group whose leader is reachable at `leader_host`."""
    return f"{leader_host}:{DIST_INIT_PORT}"

"""Builders for a role whose replica spans nodes: one LeaderWorkerSet, a group per replica.

Why one LeaderWorkerSet per role and not a DisaggregatedSet: docs/multinode.md, "How
multi-node roles are rendered". The group's pods run the role's one engine argv, joined into
one torch.distributed world by `--dist-init-addr`/`--nnodes`/`--node-rank` from the
environment the LWS pod webhook injects; the leader (worker index 0) alone serves the API, so
it alone carries the ports and the probes, and the role's Service selects it only.
"""

from __future__ import annotations

import copy

from dsv4_operator.api.roles import Role
from dsv4_operator.engine.topology import dist_init_addr
from dsv4_operator.names import (
    LWS_API_VERSION,
    LWS_EXCLUSIVE_TOPOLOGY_ANNOTATION,
    LWS_GROUP_SIZE_ENV,
    LWS_KIND,
    LWS_LEADER_ADDRESS_ENV,
    LWS_WORKER_INDEX_ENV,
)
from dsv4_operator.render.context import Manifest, RenderContext
from dsv4_operator.render.engine import pod_template, with_replicas, workload_metadata

# A worker's probes: none. Only the leader serves the API (a node > 0 runs its schedulers and,
# once they are ready, a health-only server: docs/engine-notes.md, "Start-up"), so a worker is
# ready once it runs, and a group once its leader answers /health_generate, which it does only
# once every rank of every node has joined.
_LEADER_ONLY = ("startupProbe", "readinessProbe", "livenessProbe", "ports")


def group_flags() -> dict[str, str]:
    """The multi-node flags of every pod of a group, expanded by the kubelet from the LWS
    environment (`$(VAR)` in a command is a Kubernetes reference, not a shell's)."""
    return {
        "--dist-init-addr": dist_init_addr(f"$({LWS_LEADER_ADDRESS_ENV})"),
        "--nnodes": f"$({LWS_GROUP_SIZE_ENV})",
        "--node-rank": f"$({LWS_WORKER_INDEX_ENV})",
    }


def with_group_flags(command: list[str]) -> list[str]:
    """`command` with the group flags: a value the engine argv already has (`--nnodes N`,
    engine/flags.py) is replaced by the group's own, the others appended."""
    out = list(command)
    for flag, value in group_flags().items():
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def leader_template(ctx: RenderContext, role: Role) -> Manifest:
    """The group leader: the role's engine pod (ports, probes) with the multi-node flags."""
    template = pod_template(ctx, role)
    engine = template["spec"]["containers"][0]
    engine["command"] = with_group_flags(engine["command"])
    return template


def worker_template(leader: Manifest) -> Manifest:
    """A group worker: the leader's pod without what only the leader serves."""
    worker = copy.deepcopy(leader)
    engine = worker["spec"]["containers"][0]
    for key in _LEADER_ONLY:
        engine.pop(key, None)
    return worker


def leader_worker_set(ctx: RenderContext, role: Role) -> Manifest:
    """One role's replicas as LeaderWorkerSet groups of `ctx.nodes_of(role)` pods each.

    RecreateGroupOnPodRestart: a torch.distributed world cannot take back a restarted rank,
    so one failed pod restarts its whole group. LeaderCreated: the leader cannot become ready
    before its workers have joined, so they start together. Rolling updates are the
    operator's (a transfer-format change is a new LWS under a BlueGreen pair's name), so the
    LWS rolls one group at a time inside one format only.
    """
    leader = leader_template(ctx, role)
    spec: Manifest = {
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {
            "type": "RollingUpdate",
            "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
        },
        # The role's headless Service (render/engine.py) has this name: the LWS controller
        # then creates none of its own, and leaders get `<name>-<i>.<name>` DNS names, the
        # same as a StatefulSet's pods (the router's URLs do not change with the kind).
        "networkConfig": {"subdomainPolicy": "Shared"},
        "leaderWorkerTemplate": {
            "size": ctx.nodes_of(role),
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": leader,
            "workerTemplate": worker_template(leader),
        },
    }
    metadata = workload_metadata(ctx, role)
    domain = ctx.spec.gpu.exclusive_topology
    if domain is not None:
        # LWS's pod webhook gives every pod of a group an affinity to its leader's value of
        # this node label and an anti-affinity to other groups' pods, and the controller pins
        # the workers to the leader's value once the leader is scheduled.
        metadata["annotations"][LWS_EXCLUSIVE_TOPOLOGY_ANNOTATION] = domain
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": metadata,
        "spec": with_replicas(ctx, role, spec),
    }

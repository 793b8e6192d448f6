"""Multi-node groups in a pass (pure): LeaderWorkerSet not served, and which group restarts
because one of its pods failed, with what every pod of it said last before the restart
replaces them all.

A LeaderWorkerSet with `RecreateGroupOnPodRestart` deletes a group's leader (and with it every
worker) as soon as one container of the group restarted (lws pkg/controllers/pod_controller.go,
handleRestartPolicy). The pods, and the termination messages the kubelet kept in them, are then
gone: what the watch saw of them (reconcile/group_capture.py, `World.captured_restarts`) and
what the pass itself sees are recorded in `status.groupRestarts`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from dsv4_operator.api.roles import ROLES
from dsv4_operator.api.status import DSV4DeploymentStatus, GroupRestart, PodTermination
from dsv4_operator.api.times import Timestamp
from dsv4_operator.kube.resources import LEADER_WORKER_SET
from dsv4_operator.names import LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL
from dsv4_operator.pods import ContainerView, PodView, Terminated
from dsv4_operator.reasons import ConditionReason, EventReason
from dsv4_operator.reconcile.actions import Actions
from dsv4_operator.reconcile.status import Progress
from dsv4_operator.reconcile.world import World
from dsv4_operator.render.context import RenderContext

# Entries kept in status (oldest dropped first), and characters of one termination message.
MAX_GROUP_RESTARTS = 5
MAX_MESSAGE = 512


def _last(container: ContainerView) -> Terminated | None:
    return container.terminated or container.last_terminated


def last_termination(pod: PodView) -> PodTermination:
    ended = next((t for c in pod.containers if (t := _last(c)) is not None), None)
    if ended is None:
        return PodTermination(pod=pod.name, worker_index=pod.worker_index)
    return PodTermination(
        pod=pod.name,
        worker_index=pod.worker_index,
        reason=ended.reason,
        exit_code=ended.exit_code,
        message=(ended.message or "")[-MAX_MESSAGE:],
    )


def _cause(pod: PodView, container: ContainerView) -> str:
    ended = _last(container)
    what = "leader" if pod.worker_index == 0 else f"worker {pod.worker_index}"
    how = "restarted"
    if ended is not None:
        code = "?" if ended.exit_code is None else ended.exit_code
        how = f"terminated {ended.reason or 'Error'} (exit code {code})"
    return f"pod {pod.name} ({what}) container {container.name} {how}"


def groups_of(pods: Iterable[PodView]) -> dict[str, list[PodView]]:
    """The pods of each multi-node group, by group (`<LeaderWorkerSet>-<group index>`,
    the leader's name), leader first."""
    groups: dict[str, list[PodView]] = {}
    for pod in pods:
        lws, index = pod.labels.get(LWS_NAME_LABEL), pod.labels.get(LWS_GROUP_INDEX_LABEL)
        if lws is not None and index is not None:
            groups.setdefault(f"{lws}-{index}", []).append(pod)
    return {
        name: sorted(members, key=lambda pod: pod.worker_index)
        for name, members in sorted(groups.items())
    }


def new_group_restarts(
    pods: Iterable[PodView], known: Iterable[GroupRestart], now: datetime
) -> list[GroupRestart]:
    """A restart for every group with a restarted container not recorded yet (`known`)."""
    seen = {r.key for r in known}
    out: list[GroupRestart] = []
    for group, members in groups_of(pods).items():
        failed = [(p, c) for p in members for c in p.containers if c.restart_count > 0]
        if not failed:
            continue
        pod, container = failed[0]
        key = f"{pod.uid}/{container.restart_count}"
        if key in seen:
            continue
        out.append(
            GroupRestart(
                group=group,
                role=pod.role or "",
                revision=pod.revision,
                cause=_cause(pod, container),
                at=Timestamp.of(now),
                key=key,
                pods=[last_termination(p) for p in members],
            )
        )
    return out


def restart_message(restart: GroupRestart) -> str:
    """The Event text of one group restart."""
    said = "; ".join(
        f"{p.pod}: {p.reason or 'running'}" + (f": {p.message[-160:]}" if p.message else "")
        for p in restart.pods
    )
    return (
        f"group {restart.group} ({restart.role}, revision {restart.revision}) restarts: "
        f"{restart.cause}; the LeaderWorkerSet recreates every pod of the group "
        f"(RecreateGroupOnPodRestart). Last terminations (status.groupRestarts): {said}"
    )


def groups_unavailable(actions: Actions, ctx: RenderContext) -> Progress | None:
    """A multi-node role on a cluster without LeaderWorkerSet: nothing is applied (running
    children keep serving), one Warning per episode, and the reason in status."""
    multi = [role for role in ROLES if ctx.multi_node(role)]
    if not multi or actions.world.groups_served:
        return None
    shapes = ", ".join(
        f"spec.{role} needs {ctx.nodes_of(role)} nodes per replica ({ctx.gpus[role]} GPUs, "
        f"{ctx.spec.gpu.per_node} per node)"
        for role in multi
    )
    message = (
        f"{shapes}: such roles run as LeaderWorkerSet groups, and the API server does not "
        f"serve {LEADER_WORKER_SET.api_version} {LEADER_WORKER_SET.kind}; install LWS v0.9.0 or "
        "later (docs/multinode.md) or fit each replica on one node. Nothing was rolled out; "
        "running children keep their config"
    )
    was = next((c for c in actions.world.status.conditions if c.type == "Progressing"), None)
    if was is None or was.reason != ConditionReason.GROUPS_UNAVAILABLE:
        actions.note("Warning", EventReason.GROUPS_UNAVAILABLE, message)
    return Progress(ConditionReason.GROUPS_UNAVAILABLE, message)


def unrecorded_group_restarts(world: World) -> list[GroupRestart]:
    """The group restarts status lacks: what the watch saw first (the group may be gone
    already, reconcile/group_capture.py), then what this pass's pods show."""
    recorded = {r.key for r in world.status.group_restarts}
    captured = [r for r in world.captured_restarts if r.key not in recorded]
    return captured + new_group_restarts(
        world.pods, [*world.status.group_restarts, *captured], world.now
    )


def with_group_restarts(actions: Actions, status: DSV4DeploymentStatus) -> DSV4DeploymentStatus:
    """`status` keeping every group restart seen (the last few), one Warning for each new one:
    the restart deletes the pods and their termination messages with them."""
    world = actions.world
    new = unrecorded_group_restarts(world)
    for restart in new:
        actions.note("Warning", EventReason.GROUP_RESTARTED, restart_message(restart))
    kept = [*world.status.group_restarts, *new][-MAX_GROUP_RESTARTS:]
    return status.model_copy(update={"group_restarts": kept})

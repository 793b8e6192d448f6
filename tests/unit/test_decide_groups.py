"""decide() for multi-node roles: LeaderWorkerSets applied, rolled, switched and deleted as the
StatefulSets of single-node roles are; a cluster without LWS says so and rolls nothing out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4_operator.guard.oom import oom_events
from dsv4_operator.pods import PodView
from dsv4_operator.reconcile.decide import decide
from dsv4_operator.reconcile.groups import new_group_restarts
from tests.support.builders import NOW, as_live, make_world
from tests.support.group_pods import group_pod

TWO_NODES = {"prefill.tensorParallel": 16, "decode.tensorParallel": 16}
Variant = Callable[..., dict[str, Any]]


def _kinds(objs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objs)


def _condition(decision: Any, type_: str) -> Any:
    return next(c for c in decision.status.conditions if c.type == type_)


def test_a_multi_node_spec_creates_leader_worker_sets_and_settles(variant: Variant) -> None:
    spec = variant(TWO_NODES)
    first = decide(make_world(spec))
    workloads = [k for k in _kinds(first.apply) if k[0] in ("StatefulSet", "LeaderWorkerSet")]
    assert workloads == [("LeaderWorkerSet", "x-decode"), ("LeaderWorkerSet", "x-prefill")]
    settled = decide(make_world(spec, revisions=first.create, **as_live(first.apply)))
    assert settled.writes == 0 and settled.status.phase == "Ready"
    assert settled.status.roles is not None and settled.status.roles.prefill.ready == 1


def test_groups_not_ready_keep_the_deployment_progressing(variant: Variant) -> None:
    spec = variant(TWO_NODES)
    first = decide(make_world(spec))
    pending = decide(make_world(spec, revisions=first.create, **as_live(first.apply, ready=False)))
    assert pending.status.phase == "Progressing"
    assert "prefill 0/1 groups ready" in _condition(pending, "Ready").message


def test_without_the_lws_crd_a_multi_node_spec_rolls_nothing_out_and_says_why(
    variant: Variant,
) -> None:
    spec = variant(TWO_NODES)
    decision = decide(make_world(spec, groups_served=False))
    assert not [o for o in decision.apply if o["kind"] != "ControllerRevision"]
    progressing = _condition(decision, "Progressing")
    assert progressing.reason == "GroupsUnavailable"
    assert "spec.prefill needs 2 nodes per replica" in progressing.message
    assert "leaderworkerset.x-k8s.io/v1" in progressing.message
    assert decision.status.phase == "Degraded"
    assert _condition(decision, "Degraded").reason == "GroupsUnavailable"
    [warning] = [n for n in decision.events if n.type == "Warning"]
    assert warning.reason == "GroupsUnavailable"
    # The same episode again: no second Event; LWS is looked for again on a timer.
    again = decide(make_world(spec, status=decision.status, groups_served=False))
    assert [n for n in again.events if n.reason == "GroupsUnavailable"] == []
    assert again.requeue_after is not None


def test_without_the_lws_crd_a_single_node_spec_is_unaffected(variant: Variant) -> None:
    decision = decide(make_world(variant({}), groups_served=False))
    assert [k[0] for k in _kinds(decision.apply)].count("StatefulSet") == 2
    assert _condition(decision, "Progressing").reason == "Creating"


def test_a_format_change_under_recreate_deletes_the_groups_first(variant: Variant) -> None:
    first = decide(make_world(variant(TWO_NODES)))
    changed = variant({**TWO_NODES, "engine.indexKDtype": "bf16"})
    decision = decide(
        make_world(changed, generation=2, revisions=first.create, **as_live(first.apply))
    )
    deleted = {(r.kind, n) for r, n in decision.delete}
    assert {
        ("Deployment", "x-router"),
        ("LeaderWorkerSet", "x-prefill"),
        ("LeaderWorkerSet", "x-decode"),
    } <= deleted
    assert not [o for o in decision.apply if o["kind"] == "LeaderWorkerSet"]


def test_bluegreen_for_groups_new_pair_then_router_then_old_groups_last(variant: Variant) -> None:
    blue = variant({**TWO_NODES, "rollout.strategy": "BlueGreen"})
    green = variant({**TWO_NODES, "rollout.strategy": "BlueGreen", "engine.indexKDtype": "bf16"})
    first = decide(make_world(blue))
    live = as_live(first.apply)
    start = decide(make_world(green, generation=2, revisions=first.create, **live))
    new = [o for o in start.apply if o["kind"] == "LeaderWorkerSet"]
    assert {o["metadata"]["name"].rsplit("-", 1)[0] for o in new} == {"x-prefill", "x-decode"}
    assert start.delete == [] and not [o for o in start.apply if o["kind"] == "Deployment"]
    for pool, objs in as_live(start.apply).items():
        live[pool] += objs
    revisions = first.create + start.create
    switch = decide(make_world(green, generation=2, revisions=revisions, **live))
    [router] = [o for o in switch.apply if o["kind"] == "Deployment"]
    argv = " ".join(router["spec"]["template"]["spec"]["containers"][0]["command"])
    pair = new[0]["metadata"]["labels"]["dsv4.io/pair"]
    # The router targets the new pair's group leaders only, never both pairs at once.
    assert f"x-decode-{pair}-0.x-decode-{pair}" in argv and "x-decode-0.x-decode." not in argv
    live["deployments"] = as_live([router])["deployments"]
    cleanup = decide(make_world(green, generation=2, revisions=revisions, **live))
    order = [(r.kind, n) for r, n in cleanup.delete if r.kind != "ControllerRevision"]
    assert order[-2:] == [("LeaderWorkerSet", "x-prefill"), ("LeaderWorkerSet", "x-decode")]


def test_a_worker_failure_keeps_every_pod_of_its_group_in_status_once(variant: Variant) -> None:
    spec = variant(TWO_NODES)
    first = decide(make_world(spec))
    live = as_live(first.apply)
    revision = live["statefulsets"][0]["metadata"]["labels"]["dsv4.io/revision"]
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    pods = [group_pod(0, revision), group_pod(1, revision, restarts=1, message=oom)]
    seen = decide(make_world(spec, revisions=first.create, pods=pods, **live))
    [restart] = seen.status.group_restarts
    assert restart.group == "x-decode-0" and restart.role == "decode"
    assert restart.cause.startswith("pod x-decode-0-1 (worker 1) container engine terminated")
    assert [(p.pod, p.reason) for p in restart.pods] == [
        ("x-decode-0", None),
        ("x-decode-0-1", "OOMKilled"),
    ]
    assert restart.pods[1].message == oom
    [note] = [n for n in seen.events if n.reason == "GroupRestarted"]
    assert note.type == "Warning" and "x-decode-0-1: OOMKilled" in note.message
    # The next pass sees the same restart: no second entry, no second Event; and once the
    # LWS controller has replaced the pods, the record stays.
    again = decide(make_world(spec, status=seen.status, revisions=first.create, pods=pods, **live))
    assert again.status.group_restarts == seen.status.group_restarts
    assert not [n for n in again.events if n.reason == "GroupRestarted"]
    after = decide(make_world(spec, status=again.status, revisions=first.create, **live))
    assert after.status.group_restarts == seen.status.group_restarts


def test_a_group_counts_one_oom_whichever_of_its_pods_ran_out_and_after_they_are_gone() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory."
    # Both ranks of the group ran out of memory (TP ranks fail together).
    pods = [
        PodView.of(group_pod(0, "r1", restarts=1, message=oom)),
        PodView.of(group_pod(1, "r1", restarts=1, message=oom)),
    ]
    restarts = new_group_restarts(pods, [], NOW)
    [event] = oom_events(pods, restarts)
    assert (event.pod, event.role, event.revision) == ("x-decode-0", "decode", "r1")
    # The group's pods alone (before the pass recorded the restart) count nothing twice, and
    # once the LWS controller has replaced them the recorded restart still counts.
    assert oom_events(pods) == []
    assert oom_events([], restarts) == [event]
    # A group restart without a memory signature is no OOM.
    crash = [PodView.of(group_pod(1, "r1", restarts=1, message="NCCL error", reason="Error"))]
    assert len(new_group_restarts(crash, [], NOW)) == 1
    assert oom_events([], new_group_restarts(crash, [], NOW)) == []


def test_the_status_names_the_stuck_pod_of_a_stuck_group_and_why(variant: Variant) -> None:
    spec = variant(TWO_NODES)
    first = decide(make_world(spec))
    live = as_live(first.apply, ready=False)
    revision = live["statefulsets"][0]["metadata"]["labels"]["dsv4.io/revision"]
    leader, worker = group_pod(0, revision), group_pod(1, revision)
    worker["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
            }
        ],
    }
    for pod in (leader, worker):
        pod["metadata"]["labels"]["dsv4.io/pair"] = "main"
    stuck = decide(make_world(spec, revisions=first.create, pods=[leader, worker], **live))
    message = _condition(stuck, "Ready").message
    assert "decode 0/1 groups ready" in message
    assert "pod x-decode-0-1" in message and "Insufficient nvidia.com/gpu" in message

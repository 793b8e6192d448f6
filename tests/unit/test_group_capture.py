"""Group restarts captured from the watch (reconcile/group_capture.py): a pass that sees only
the recreated group still records the restart with every old pod's last termination, once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4_operator.reconcile.decide import decide
from dsv4_operator.reconcile.group_capture import GroupRestartCapture
from tests.support.builders import NOW, as_live, make_world
from tests.support.group_pods import group_pod

TWO_NODES = {"prefill.tensorParallel": 16, "decode.tensorParallel": 16}
KEY = ("ns", "x")
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
SIGTERM = {"reason": "Error", "exitCode": 143, "message": "NCCL watchdog: rank 1 gone"}
Variant = Callable[..., dict[str, Any]]


def _deleting(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return pod


def _restart_seen_only_by_the_watch(capture: GroupRestartCapture, revision: str) -> None:
    """What the watch delivers of one group restart: the group runs, worker 1's engine is
    OOM-killed and restarted, LWS deletes the group (the leader's engine ends on SIGTERM),
    the old pods go, the recreated group runs."""
    capture.saw(group_pod(0, revision), deleted=False)
    capture.saw(group_pod(1, revision), deleted=False)
    capture.saw(group_pod(1, revision, restarts=1, message=OOM), deleted=False)
    capture.saw(_deleting(group_pod(0, revision)), deleted=False)
    leader_ended = _deleting(group_pod(0, revision, terminated=SIGTERM))
    capture.saw(leader_ended, deleted=False)
    capture.saw(leader_ended, deleted=True)
    capture.saw(_deleting(group_pod(1, revision, restarts=1, message=OOM)), deleted=True)
    for worker in (0, 1):
        capture.saw(group_pod(worker, revision, uid=f"new-{worker}"), deleted=False)


def test_a_pass_that_sees_only_the_recreated_group_still_reports_the_restart(
    variant: Variant,
) -> None:
    spec = variant(TWO_NODES)
    first = decide(make_world(spec))
    live = as_live(first.apply)
    revision = live["statefulsets"][0]["metadata"]["labels"]["dsv4.io/revision"]
    capture = GroupRestartCapture(lambda: NOW)
    _restart_seen_only_by_the_watch(capture, revision)
    recreated = [group_pod(w, revision, uid=f"new-{w}") for w in (0, 1)]

    world = make_world(
        spec,
        revisions=first.create,
        pods=recreated,
        captured_restarts=capture.pending(KEY, recorded=[]),
        **live,
    )
    seen = decide(world)
    [restart] = seen.status.group_restarts
    assert restart.group == "x-decode-0" and restart.role == "decode"
    assert restart.revision == revision and restart.key == "uid-1/1"
    assert restart.cause.startswith("pod x-decode-0-1 (worker 1) container engine terminated")
    # Each old pod's last termination: the leader's from its deletion, the worker's OOM.
    assert [(p.pod, p.reason, p.exit_code, p.message) for p in restart.pods] == [
        ("x-decode-0", "Error", 143, SIGTERM["message"]),
        ("x-decode-0-1", "OOMKilled", 137, OOM),
    ]
    [note] = [n for n in seen.events if n.reason == "GroupRestarted"]
    assert "x-decode-0-1: OOMKilled" in note.message

    # Once status holds it, the capture drops it: no second entry, no second Event, even
    # when a late event of an old pod arrives.
    recorded = [r.key for r in seen.status.group_restarts]
    assert capture.pending(KEY, recorded) == ()
    capture.saw(group_pod(1, revision, restarts=1, message=OOM), deleted=True)
    assert capture.pending(KEY, recorded) == ()
    again = decide(
        make_world(
            spec,
            status=seen.status,
            revisions=first.create,
            pods=recreated,
            captured_restarts=capture.pending(KEY, recorded),
            **live,
        )
    )
    assert again.status.group_restarts == seen.status.group_restarts
    assert not [n for n in again.events if n.reason == "GroupRestarted"]


def test_a_restart_the_pass_also_sees_is_recorded_once() -> None:
    capture = GroupRestartCapture(lambda: NOW)
    pods = [group_pod(0, "r1"), group_pod(1, "r1", restarts=1, message=OOM)]
    for pod in pods:
        capture.saw(pod, deleted=False)
    [captured] = capture.pending(KEY, recorded=[])
    assert captured.key == "uid-1/1"
    assert [p.reason for p in captured.pods] == [None, "OOMKilled"]


def test_pods_of_other_deployments_and_single_node_pods_are_not_captured() -> None:
    capture = GroupRestartCapture(lambda: NOW)
    other = group_pod(1, "r1", restarts=1, message=OOM)
    other["metadata"]["labels"]["dsv4.io/deployment"] = "y"
    single = group_pod(1, "r1", restarts=1, message=OOM, uid="single")
    del single["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
    for pod in (other, single):
        capture.saw(pod, deleted=False)
    assert capture.pending(KEY, recorded=[]) == ()
    assert len(capture.pending(("ns", "y"), recorded=[])) == 1
    capture.forget(("ns", "y"))
    assert capture.pending(("ns", "y"), recorded=[]) == ()


def test_the_guard_counts_a_captured_oom_in_the_pass_that_records_it(variant: Variant) -> None:
    spec = variant(TWO_NODES)
    first = decide(make_world(spec))
    live = as_live(first.apply)
    revision = live["statefulsets"][0]["metadata"]["labels"]["dsv4.io/revision"]
    settled = decide(make_world(spec, revisions=first.create, **live))
    assert settled.status.guard is not None and settled.status.guard.oom_events == 0
    capture = GroupRestartCapture(lambda: NOW)
    _restart_seen_only_by_the_watch(capture, revision)
    world = make_world(
        spec,
        status=settled.status,
        revisions=first.create,
        pods=[group_pod(w, revision, uid=f"new-{w}") for w in (0, 1)],
        captured_restarts=capture.pending(KEY, recorded=[]),
        **live,
    )
    seen = decide(world)
    assert seen.status.guard is not None and seen.status.guard.oom_events == 1
    assert len(seen.status.group_restarts) == 1

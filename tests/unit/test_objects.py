"""Typed views of the children: built once from the objects as the API server returns them,
read by decisions field by field, and keeping the object for what goes back as it is."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from dsv4_operator.kube.objects import DeploymentView, RevisionView, StatefulSetView
from dsv4_operator.pods import PodView
from dsv4_operator.reconcile.decide import decide
from tests.support.builders import as_live, engine_pod, example_doc, make_world


def _first_pass() -> tuple[dict[str, Any], Any]:
    spec = example_doc()["spec"]
    return spec, decide(make_world(spec))


def test_statefulset_view_reads_role_pair_revision_format_and_readiness() -> None:
    _, first = _first_pass()
    live = as_live(first.apply)
    [decode] = [s for s in live["statefulsets"] if s["metadata"]["name"] == "x-decode"]
    view = StatefulSetView.of(decode)
    labels, annotations = decode["metadata"]["labels"], decode["metadata"]["annotations"]
    assert (view.name, view.role, view.pair) == ("x-decode", "decode", "main")
    assert view.revision == labels["dsv4.io/revision"]
    assert view.format == annotations["dsv4.io/transfer-format"]
    assert view.replicas == decode["spec"]["replicas"] == view.ready
    assert view.rolled and view.raw is decode
    starting = StatefulSetView.of(as_live([decode], ready=False)["statefulsets"][0])
    assert starting.ready == 0 and not starting.rolled
    behind = copy.deepcopy(decode)
    behind["metadata"]["generation"] = 2  # a new template the controller has not seen
    assert not StatefulSetView.of(behind).rolled
    unset = copy.deepcopy(decode)
    del unset["spec"]["replicas"]
    assert StatefulSetView.of(unset).replicas is None


def test_deployment_view_reads_the_routers_target_and_availability() -> None:
    _, first = _first_pass()
    [router] = as_live(first.apply)["deployments"]
    view = DeploymentView.of(router)
    assert view.name == "x-router" and view.target_pair == "main"
    assert view.available == view.replicas and view.rolled and view.raw is router
    assert not DeploymentView.of(as_live([router], ready=False)["deployments"][0]).rolled


def test_revision_view_reads_hash_number_and_stored_spec() -> None:
    _, first = _first_pass()
    [stored] = first.create
    view = RevisionView.of(stored)
    assert view.hash == stored["metadata"]["labels"]["dsv4.io/revision"]
    assert view.number == 1 and view.name == f"x-{view.hash}"
    assert view.spec == stored["data"]["spec"] and view.raw is stored


def test_pod_view_reads_labels_conditions_and_container_states() -> None:
    pod = engine_pod(
        "r1",
        {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-11-29T11:58:00Z"},
    )
    pod["metadata"]["creationTimestamp"] = "2026-11-29T11:00:00Z"
    pod["metadata"]["labels"]["dsv4.io/pair"] = "main"
    pod["status"].update(
        phase="Running",
        podIP="10.0.0.7",
        conditions=[
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"},
        ],
    )
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    view = PodView.of(pod)
    assert (view.name, view.uid, view.role, view.revision, view.pair) == (
        "x-decode-0",
        "p1",
        "decode",
        "r1",
        "main",
    )
    assert (view.phase, view.ip, view.scheduled, view.ready) == ("Running", "10.0.0.7", True, False)
    assert view.age(datetime(2026, 11, 29, 12, 0, tzinfo=UTC)) == 3600.0
    [engine] = view.containers
    assert engine.name == "engine" and engine.restart_count == 1
    assert engine.waiting is not None and engine.waiting.reason == "CrashLoopBackOff"
    assert engine.terminated is None
    last = engine.last_terminated
    assert last is not None and (last.reason, last.exit_code) == ("OOMKilled", 137)
    assert last.finished == "2026-11-29T11:58:00Z"
    assert last.finished is not None and last.finished.at == datetime(
        2026, 11, 29, 11, 58, tzinfo=UTC
    )
    # An empty state, as a kubelet may leave one, is no termination.
    bare = PodView.of({"metadata": {"name": "p"}, "status": {"containerStatuses": [{}]}})
    assert bare.containers[0].terminated is None and bare.containers[0].waiting is None
    assert bare.created is None and bare.age(datetime.now(UTC)) == 0.0


def test_the_world_reads_children_through_views_and_hands_back_their_objects() -> None:
    spec, first = _first_pass()
    live = as_live(first.apply)
    model = {"apiVersion": "dsv4.io/v1alpha1", "kind": "DSV4Model", "metadata": {"name": "x"}}
    world = make_world(
        spec,
        revisions=first.create,
        pods=[engine_pod("r1", {"reason": "Error"})],
        weights=[model],
        **live,
    )
    assert all(isinstance(s, StatefulSetView) for s in world.statefulsets)
    assert [p.name for p in world.pods] == ["x-decode-0"]
    assert world.weights == [model]
    [decode] = [s for s in live["statefulsets"] if s["metadata"]["name"] == "x-decode"]
    assert world.live("StatefulSet", "x-decode") is decode
    assert world.live("DSV4Model", "x") is model
    router = world.router()
    assert router is not None and world.live("Deployment", "x-router") is router.raw
    revision = world.revision(first.create[0]["metadata"]["name"])
    assert revision is not None and revision.raw is first.create[0]
    assert world.active_pair_id() == "main"
    assert set(world.pairs()["main"].statefulsets) == {"prefill", "decode"}

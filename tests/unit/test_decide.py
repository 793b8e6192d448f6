"""decide() on hand-built worlds: the pure rollout and status logic, without an API server."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.engine.validation import validate_spec
from dsv4_operator.reconcile.decide import decide
from dsv4_operator.reconcile.world import World

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _world(
    spec: dict[str, Any], status: DSV4DeploymentStatus | dict[str, Any] | None = None, **kw: Any
) -> World:
    """A world as gather() builds it: the spec validated and the status parsed."""
    base: dict[str, Any] = {
        "name": "x",
        "namespace": "ns",
        "uid": "u1",
        "generation": 1,
        "validation": validate_spec(spec),
        "status": DSV4DeploymentStatus.model_validate(status or {}),
        "now": NOW,
    }
    base.update(kw)
    return World(**base)


def _as_live(objs: list[dict[str, Any]], ready: bool = True) -> dict[str, list[dict[str, Any]]]:
    """What the API server would hold after applying `objs` (and, if ready, after rolling)."""
    pools: dict[str, list[dict[str, Any]]] = {
        "statefulsets": [],
        "deployments": [],
        "services": [],
        "pdbs": [],
    }
    key = {
        "StatefulSet": "statefulsets",
        "Deployment": "deployments",
        "Service": "services",
        "PodDisruptionBudget": "pdbs",
    }
    for obj in objs:
        live = copy.deepcopy(obj)
        live["metadata"]["generation"] = 1
        replicas = live.get("spec", {}).get("replicas", 1)
        if obj["kind"] == "StatefulSet":
            n = replicas if ready else 0
            live["status"] = {
                "observedGeneration": 1,
                "replicas": replicas,
                "readyReplicas": n,
                "updatedReplicas": replicas,
                "currentRevision": "r",
                "updateRevision": "r",
            }
        if obj["kind"] == "Deployment":
            live["status"] = {
                "observedGeneration": 1,
                "replicas": replicas,
                "updatedReplicas": replicas,
                "availableReplicas": replicas if ready else 0,
            }
        pools[key[obj["kind"]]].append(live)
    return pools


def test_fresh_create_applies_everything(variant: Callable[..., dict[str, Any]]) -> None:
    decision = decide(_world(variant({})))
    kinds = sorted(o["kind"] for o in decision.apply)
    assert kinds.count("StatefulSet") == 2 and kinds.count("Deployment") == 1
    assert [o["kind"] for o in decision.create] == ["ControllerRevision"]
    assert {n.reason for n in decision.events} == {"Creating", "RevisionCreated"}
    assert decision.status.phase == "Progressing"
    # Waiting for the children is event-driven: no timer.
    assert decision.waiting and decision.requeue_after is None


def test_settled_world_needs_no_write(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant({})
    first = decide(_world(spec))
    world = _world(spec, revisions=first.create, **_as_live(first.apply))
    second = decide(world)
    assert second.writes == 0 and second.events == []
    assert second.status.phase == "Ready"
    # The status it computes, once stored, is stable: a third pass writes nothing either.
    third = decide(
        _world(spec, status=second.status, revisions=first.create, **_as_live(first.apply))
    )
    assert third.status == second.status


def test_invalid_spec_touches_no_child(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant({})
    first = decide(_world(spec))
    bad = variant({"engine.indexKDtype": "bf16", "engine.overlap.multiStream": True})
    decision = decide(_world(bad, generation=2, revisions=first.create, **_as_live(first.apply)))
    assert decision.apply == [] and decision.delete == [] and decision.create == []
    assert decision.status.phase == "Invalid"
    [note] = decision.events
    assert note.type == "Warning" and "DSV4-R002" in note.message
    # Same invalid spec again: the condition is unchanged, so no second event.
    again = decide(
        _world(
            bad,
            generation=2,
            status=decision.status,
            revisions=first.create,
            **_as_live(first.apply),
        )
    )
    assert again.events == [] and again.status == decision.status


def test_compatible_change_updates_decode_before_prefill(
    variant: Callable[..., dict[str, Any]],
) -> None:
    first = decide(_world(variant({})))
    live = _as_live(first.apply)
    changed = variant({"engine.maxRunningRequests": 48})
    decision = decide(_world(changed, generation=2, revisions=first.create, **live))
    names = {o["metadata"]["name"] for o in decision.apply if o["kind"] == "StatefulSet"}
    assert names == {"x-decode"}
    assert decision.status.conditions[1].reason == "RollingUpdate"


def test_format_change_recreate_deletes_router_and_pair_first(
    variant: Callable[..., dict[str, Any]],
) -> None:
    first = decide(_world(variant({})))
    changed = variant({"engine.indexKDtype": "bf16"})
    decision = decide(
        _world(changed, generation=2, revisions=first.create, **_as_live(first.apply))
    )
    assert not [o for o in decision.apply if o["kind"] in ("StatefulSet", "Deployment")]
    deleted = {(r.kind, n) for r, n in decision.delete}
    assert {
        ("Deployment", "x-router"),
        ("StatefulSet", "x-prefill"),
        ("StatefulSet", "x-decode"),
    } <= deleted


def test_a_deleted_statefulset_is_recreated_alone(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant({})
    first = decide(_world(spec))
    live = _as_live(first.apply)
    live["statefulsets"] = [s for s in live["statefulsets"] if s["metadata"]["name"] != "x-prefill"]
    decision = decide(_world(spec, revisions=first.create, **live))
    assert decision.delete == []  # no Recreate: the router and decode keep running
    assert {(o["kind"], o["metadata"]["name"]) for o in decision.apply} == {
        ("StatefulSet", "x-prefill")
    }
    [note] = decision.events
    assert (note.type, note.reason) == ("Warning", "ChildRecreated")
    assert "x-prefill" in note.message


def test_format_change_bluegreen_starts_new_pair_and_keeps_router(
    variant: Callable[..., dict[str, Any]],
) -> None:
    first = decide(_world(variant({"rollout.strategy": "BlueGreen"})))
    changed = variant({"rollout.strategy": "BlueGreen", "engine.indexKDtype": "bf16"})
    decision = decide(
        _world(changed, generation=2, revisions=first.create, **_as_live(first.apply))
    )
    names = {o["metadata"]["name"] for o in decision.apply}
    assert all(n.startswith(("x-prefill-", "x-decode-")) for n in names)
    assert decision.delete == []


def test_revisions_pruned_beyond_limit(variant: Callable[..., dict[str, Any]]) -> None:
    first = decide(_world(variant({})))
    old = []
    for i in range(12):
        rev = copy.deepcopy(first.create[0])
        rev["metadata"]["name"] = f"x-old{i}"
        rev["metadata"]["labels"]["dsv4.io/revision"] = f"old{i}"
        rev["revision"] = i + 2
        old.append(rev)
    decision = decide(_world(variant({}), revisions=first.create + old, **_as_live(first.apply)))
    pruned = {n for r, n in decision.delete if r.kind == "ControllerRevision"}
    # 13 revisions, limit 10: the three oldest would go, but the pods run the first one.
    assert pruned == {"x-old0", "x-old1"}


def test_disabling_the_service_monitor_deletes_it(variant: Callable[..., dict[str, Any]]) -> None:
    enabled = variant({"monitoring.serviceMonitor": {"enabled": True}})
    first = decide(_world(enabled))
    [monitor] = [o for o in first.apply if o["kind"] == "ServiceMonitor"]
    live = _as_live([o for o in first.apply if o["kind"] != "ServiceMonitor"])
    world = _world(variant({}), revisions=first.create, service_monitors=[monitor], **live)
    assert ("ServiceMonitor", "x") in {(r.kind, n) for r, n in decide(world).delete}

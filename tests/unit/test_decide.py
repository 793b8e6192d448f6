"""decide() on hand-built worlds: the pure rollout and status logic, without an API server."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.names import REVISION_LABEL
from dsv4_operator.reconcile.decide import decide
from tests.support.builders import as_live, make_world


def test_fresh_create_applies_everything(variant: Callable[..., dict[str, Any]]) -> None:
    decision = decide(make_world(variant({})))
    kinds = sorted(o["kind"] for o in decision.apply)
    assert kinds.count("StatefulSet") == 2 and kinds.count("Deployment") == 1
    assert [o["kind"] for o in decision.create] == ["ControllerRevision"]
    # One Event for the first pair and its stored config (one request, not two).
    [creating] = decision.events
    revision = decision.create[0]["metadata"]["name"]
    assert creating.reason == "Creating" and "stored engine config revision" in creating.message
    assert creating.message.endswith(f" as {revision}")
    assert decision.status.phase == "Progressing"
    # Waiting for the children is event-driven; the one timer is the progress deadline
    # (600 s by default, a second past it), which no watch event marks.
    assert decision.waiting and decision.requeue_after == 601.0


def test_settled_world_needs_no_write(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant({})
    first = decide(make_world(spec))
    world = make_world(spec, revisions=first.create, **as_live(first.apply))
    second = decide(world)
    assert second.writes == 0 and second.events == []
    assert second.status.phase == "Ready"
    # The status it computes, once stored, is stable: a third pass writes nothing either.
    third = decide(
        make_world(spec, status=second.status, revisions=first.create, **as_live(first.apply))
    )
    assert third.status == second.status


def test_invalid_spec_touches_no_child(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant({})
    first = decide(make_world(spec))
    bad = variant({"engine.indexKDtype": "bf16", "engine.overlap.multiStream": True})
    decision = decide(make_world(bad, generation=2, revisions=first.create, **as_live(first.apply)))
    assert decision.apply == [] and decision.delete == [] and decision.create == []
    assert decision.status.phase == "Invalid"
    [note] = decision.events
    assert note.type == "Warning" and "DSV4-R002" in note.message
    # Same invalid spec again: the condition is unchanged, so no second event.
    again = decide(
        make_world(
            bad,
            generation=2,
            status=decision.status,
            revisions=first.create,
            **as_live(first.apply),
        )
    )
    assert again.events == [] and again.status == decision.status


def test_compatible_change_updates_decode_before_prefill(
    variant: Callable[..., dict[str, Any]],
) -> None:
    first = decide(make_world(variant({})))
    live = as_live(first.apply)
    changed = variant({"engine.maxRunningRequests": 48})
    decision = decide(make_world(changed, generation=2, revisions=first.create, **live))
    names = {o["metadata"]["name"] for o in decision.apply if o["kind"] == "StatefulSet"}
    assert names == {"x-decode"}
    assert decision.status.conditions[1].reason == "RollingUpdate"
    # No pair is created: the new config's stored revision has an Event of its own.
    assert "RevisionCreated" in {n.reason for n in decision.events}


def test_format_change_recreate_deletes_router_and_pair_first(
    variant: Callable[..., dict[str, Any]],
) -> None:
    first = decide(make_world(variant({})))
    changed = variant({"engine.indexKDtype": "bf16"})
    decision = decide(
        make_world(changed, generation=2, revisions=first.create, **as_live(first.apply))
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
    first = decide(make_world(spec))
    live = as_live(first.apply)
    live["statefulsets"] = [s for s in live["statefulsets"] if s["metadata"]["name"] != "x-prefill"]
    served = {"currentRevision": _revision(first)}  # the pair ran: it was Ready once
    decision = decide(make_world(spec, served, revisions=first.create, **live))
    assert decision.delete == []  # no Recreate: the router and decode keep running
    assert {(o["kind"], o["metadata"]["name"]) for o in decision.apply} == {
        ("StatefulSet", "x-prefill")
    }
    [note] = decision.events
    assert (note.type, note.reason) == ("Warning", "ChildRecreated")
    assert "x-prefill" in note.message


def test_a_first_create_the_api_server_refused_part_of_is_finished_without_a_recreate_warning(
    variant: Callable[..., dict[str, Any]],
) -> None:
    """The first pair's children go out together: a refused one leaves the others created.
    The pair never ran (no current revision), so the missing one is not "deleted by someone"."""
    spec = variant({})
    first = decide(make_world(spec))
    live = as_live(first.apply)
    live["statefulsets"] = [s for s in live["statefulsets"] if s["metadata"]["name"] != "x-decode"]
    decision = decide(make_world(spec, revisions=first.create, **live))
    assert decision.delete == []
    assert ("StatefulSet", "x-decode") in {
        (o["kind"], o["metadata"]["name"]) for o in decision.apply
    }
    assert [n.reason for n in decision.events if n.reason == "ChildRecreated"] == []


def _revision(decision: Any) -> str:
    [revision] = decision.create
    return str(revision["metadata"]["labels"][REVISION_LABEL])


def test_format_change_bluegreen_starts_new_pair_and_keeps_router(
    variant: Callable[..., dict[str, Any]],
) -> None:
    first = decide(make_world(variant({"rollout.strategy": "BlueGreen"})))
    changed = variant({"rollout.strategy": "BlueGreen", "engine.indexKDtype": "bf16"})
    decision = decide(
        make_world(changed, generation=2, revisions=first.create, **as_live(first.apply))
    )
    names = {o["metadata"]["name"] for o in decision.apply}
    assert all(n.startswith(("x-prefill-", "x-decode-")) for n in names)
    assert decision.delete == []


def test_revisions_pruned_beyond_limit(variant: Callable[..., dict[str, Any]]) -> None:
    first = decide(make_world(variant({})))
    old = []
    for i in range(12):
        rev = copy.deepcopy(first.create[0])
        rev["metadata"]["name"] = f"x-old{i}"
        rev["metadata"]["labels"]["dsv4.io/revision"] = f"old{i}"
        rev["revision"] = i + 2
        old.append(rev)
    decision = decide(make_world(variant({}), revisions=first.create + old, **as_live(first.apply)))
    pruned = {n for r, n in decision.delete if r.kind == "ControllerRevision"}
    # 13 revisions, limit 10: the three oldest would go, but the pods run the first one.
    assert pruned == {"x-old0", "x-old1"}


def test_disabling_the_service_monitor_deletes_it(variant: Callable[..., dict[str, Any]]) -> None:
    enabled = variant({"monitoring.serviceMonitor": {"enabled": True}})
    first = decide(make_world(enabled))
    [monitor] = [o for o in first.apply if o["kind"] == "ServiceMonitor"]
    live = as_live([o for o in first.apply if o["kind"] != "ServiceMonitor"])
    world = make_world(variant({}), revisions=first.create, service_monitors=[monitor], **live)
    assert ("ServiceMonitor", "x") in {(r.kind, n) for r, n in decide(world).delete}


def _monitoring(status: DSV4DeploymentStatus) -> Any:
    return next(c for c in status.conditions if c.type == "MonitoringReady")


def test_a_service_monitor_without_its_crd_is_reported_once_and_the_rest_goes_on(
    variant: Callable[..., dict[str, Any]],
) -> None:
    enabled = variant({"monitoring.serviceMonitor": {"enabled": True}})
    first = decide(make_world(enabled, monitoring_served=False))
    kinds = {o["kind"] for o in first.apply}
    assert "ServiceMonitor" not in kinds and {"StatefulSet", "Deployment", "Service"} <= kinds
    condition = _monitoring(first.status)
    assert (condition.status, condition.reason) == ("False", "CRDMissing")
    assert "prometheus-operator" in condition.message
    assert [n.type for n in first.events if n.reason == "CRDMissing"] == ["Warning"]
    # Next pass, the condition already says it: no second Event.
    live = as_live(first.apply)
    second = decide(
        make_world(
            enabled, status=first.status, revisions=first.create, monitoring_served=False, **live
        )
    )
    assert "CRDMissing" not in {n.reason for n in second.events}
    assert second.writes == 0 and second.status.phase == "Ready"
    # The CRDs installed: the monitor is applied and the condition turns True.
    third = decide(make_world(enabled, status=second.status, revisions=first.create, **live))
    assert [o["kind"] for o in third.apply] == ["ServiceMonitor"]
    assert (_monitoring(third.status).status, _monitoring(third.status).reason) == (
        "True",
        "Applied",
    )


def test_monitoring_disabled_is_a_true_condition(variant: Callable[..., dict[str, Any]]) -> None:
    decision = decide(make_world(variant({}), monitoring_served=False))
    condition = _monitoring(decision.status)
    assert (condition.status, condition.reason) == ("True", "Disabled")
    assert "CRDMissing" not in {n.reason for n in decision.events}


def _blue_green_done(variant: Callable[..., dict[str, Any]]) -> tuple[dict[str, Any], Any]:
    """Both pairs live and ready, the router switched to the new one: (spec, live pools)."""
    blue = variant({"rollout.strategy": "BlueGreen"})
    green = variant({"rollout.strategy": "BlueGreen", "engine.indexKDtype": "bf16"})
    first = decide(make_world(blue))
    start = decide(make_world(green, generation=2, revisions=first.create, **as_live(first.apply)))
    both = as_live(first.apply)
    for pool, objs in as_live(start.apply).items():
        both[pool] += objs
    revisions = first.create + start.create
    switch = decide(make_world(green, generation=2, revisions=revisions, **both))
    [router] = [o for o in switch.apply if o["kind"] == "Deployment"]
    both["deployments"] = as_live([router])["deployments"]
    return green, (revisions, both)


def test_the_old_pair_goes_services_first_statefulsets_last(
    variant: Callable[..., dict[str, Any]],
) -> None:
    spec, (revisions, live) = _blue_green_done(variant)
    cleanup = decide(make_world(spec, generation=2, revisions=revisions, **live))
    order = [(r.kind, n) for r, n in cleanup.delete if r.kind != "ControllerRevision"]
    assert order[-2:] == [("StatefulSet", "x-prefill"), ("StatefulSet", "x-decode")]
    assert set(order[:-2]) == {
        (kind, name)
        for kind in ("Service", "PodDisruptionBudget")
        for name in ("x-prefill", "x-decode")
    }


def test_services_and_pdbs_of_a_pair_without_statefulsets_are_deleted(
    variant: Callable[..., dict[str, Any]],
) -> None:
    """An operator stopped in the middle of deleting the old pair left its decode Service
    and PDB behind: the next pass deletes them."""
    spec, (revisions, live) = _blue_green_done(variant)
    old = {"x-prefill", "x-decode"}
    live["statefulsets"] = [s for s in live["statefulsets"] if s["metadata"]["name"] not in old]
    for pool in ("services", "pdbs"):
        live[pool] = [o for o in live[pool] if o["metadata"]["name"] != "x-prefill"]
    decision = decide(make_world(spec, generation=2, revisions=revisions, **live))
    assert {(r.kind, n) for r, n in decision.delete if r.kind != "ControllerRevision"} == {
        ("Service", "x-decode"),
        ("PodDisruptionBudget", "x-decode"),
    }
    assert [n.reason for n in decision.events] == ["OrphansDeleted"]
    assert decision.apply == []

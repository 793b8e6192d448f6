"""Phases and conditions through decide(): a planned rollout reads Progressing, never
Degraded; a stuck step turns Failed at its progress deadline; every condition has a message."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.reconcile.decide import decide
from dsv4_operator.reconcile.pod_causes import PodWarnings
from tests.support.builders import as_live, make_world, silent_pod


def _conditions(status: DSV4DeploymentStatus) -> dict[str, Any]:
    return {c.type: c for c in status.conditions}


def test_a_recreate_is_progressing_until_the_router_is_available(
    variant: Callable[..., dict[str, Any]],
) -> None:
    """After a Recreate the new roles run and are ready while the router's new pod is not
    available yet: a planned step, not a fault (main said Degraded ReplicasUnavailable)."""
    spec = variant({"engine.indexKDtype": "bf16"})
    created = decide(make_world(spec))
    live = as_live([o for o in created.apply if o["kind"] != "Deployment"])
    live["deployments"] = as_live(
        [o for o in created.apply if o["kind"] == "Deployment"], ready=False
    )["deployments"]
    decision = decide(make_world(spec, revisions=created.create, **live))
    conditions = _conditions(decision.status)
    assert decision.status.phase == "Progressing"
    assert conditions["Degraded"].status == "False"
    assert conditions["Progressing"].status == "True"
    assert "router" in conditions["Progressing"].message


def test_every_condition_carries_a_message(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant({})
    first = decide(make_world(spec))
    settled = decide(make_world(spec, revisions=first.create, **as_live(first.apply)))
    for status in (first.status, settled.status):
        assert [c.type for c in status.conditions if not c.message] == []


def test_a_stuck_step_turns_failed_once_its_deadline_passes(
    variant: Callable[..., dict[str, Any]],
) -> None:
    spec = variant({"progressDeadlineSeconds": 60})
    first = decide(make_world(spec))
    live = as_live(first.apply, ready=False)
    start = make_world(spec, status=first.status, revisions=first.create, **live)
    waiting = decide(start)
    assert waiting.status.phase == "Progressing" and waiting.requeue_after is not None
    later = dataclasses.replace(
        start, status=waiting.status, now=start.now + timedelta(seconds=waiting.requeue_after)
    )
    stuck = decide(later)
    degraded = _conditions(stuck.status)["Degraded"]
    assert stuck.status.phase == "Failed"
    assert (degraded.status, degraded.reason) == ("True", "ProgressDeadlineExceeded")


def test_a_pod_silent_in_its_status_gets_a_pass_when_its_events_would_be_read(
    variant: Callable[..., dict[str, Any]],
) -> None:
    """A pod not ready for 3 s with nothing in its status (ContainerCreating: a FailedMount
    says so only in its Events, read once it has waited 10 s): the pass asks for another one
    just after that moment, since no watch event marks it."""
    spec = variant({})
    first = decide(make_world(spec))
    live = as_live(first.apply)
    pod = silent_pod(  # 3 s before the world's now
        "2026-11-29T11:59:57Z", uid="p1", labels={"dsv4.io/role": "decode"}
    )
    settled = make_world(spec, status=first.status, revisions=first.create, **live)
    assert decide(settled).requeue_after is None
    silent = decide(dataclasses.replace(settled, pods=make_world(spec, pods=[pod]).pods))
    assert silent.requeue_after == 8.0  # 10 s - 3 s, and a second for the pass to find it
    # Stuck since: its Events were listed 45 s ago, and are listed again 60 s after that.
    stuck = dataclasses.replace(
        settled,
        pods=make_world(
            spec,
            pods=[silent_pod("2026-11-29T11:58:00Z", uid="p1", labels={"dsv4.io/role": "decode"})],
        ).pods,
        pod_events={"x-decode-0": PodWarnings(settled.now - timedelta(seconds=45))},
    )
    assert decide(stuck).requeue_after == 16.0

"""Event-driven at rest: with 20 DSV4Deployments and nothing changing for a minute, the
operator makes no LIST, no GET of an object and no write (counted by the operator and by the
API server), only the discovery reads that look for kinds not installed, and a repeated Event
is aggregated instead of created again.

A control plane of its own (no scheduler: the engine pods stay Pending, which is a state
that does not change), so no other test's namespace teardown shows in the API server's
request counters.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import Cluster, example
from dsv4_devcluster.operator import OperatorProcess
from dsv4_operator.runtime.watched import WATCHED
from tests.support.paths import CRD_PATH

DEPLOYMENTS = 20
CHILDREN = 9  # 2 StatefulSets + 3 Services + 1 Deployment + 3 PodDisruptionBudgets
IDLE_SECONDS = 60
# Every kind the operator reads (its watch cache's list).
OUR_RESOURCES = tuple(w.resource.plural for w in WATCHED)


@pytest.fixture(scope="module")
def quiet_plane() -> Iterator[ControlPlane]:
    with ControlPlane(crds=[CRD_PATH]) as cp:
        yield cp


@pytest.fixture
def world(quiet_plane: ControlPlane, tmp_path: Path) -> Iterator[tuple[Cluster, OperatorProcess]]:
    dyn = quiet_plane.dynamic_client()
    namespace = f"idle-{time.monotonic_ns() % 10**8}"
    dyn.resources.get(api_version="v1", kind="Namespace").create(
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    operator = OperatorProcess(quiet_plane.kubeconfig_path, namespace, tmp_path).start()
    try:
        yield Cluster(dyn, namespace), operator
    finally:
        operator.stop()


def _counter(operator: OperatorProcess, name: str, **labels: str) -> float:
    value = operator.metric(name, **labels)
    assert value is not None, "the operator's metrics endpoint is down"
    return value


def _our_counts(operator: OperatorProcess) -> dict[str, float]:
    discovery = _counter(operator, "dsv4_api_reads_total", verb="get", resource="discovery")
    return {
        "writes": _counter(operator, "dsv4_api_writes_total"),
        "lists": _counter(operator, "dsv4_api_reads_total", verb="list"),
        "gets": _counter(operator, "dsv4_api_reads_total", verb="get") - discovery,
        "watch lists": _counter(operator, "dsv4_watch_lists_total"),
        "discovery": discovery,
        "passes": _counter(operator, "dsv4_reconciles_total"),
    }


@pytest.mark.long(seconds=80)
def test_an_idle_minute_with_20_deployments_makes_no_list_and_no_write(
    quiet_plane: ControlPlane, world: tuple[Cluster, OperatorProcess]
) -> None:
    cluster, operator = world
    names = [f"idle-{i:02d}" for i in range(DEPLOYMENTS)]
    for name in names:
        cluster.apply(example(cluster.namespace, name=name))

    def settled() -> bool:
        # Every pod created too (no scheduler here: they stay Pending), so the StatefulSet
        # and ReplicaSet controllers have nothing left to create during the idle minute.
        pods = 0
        for name in names:
            obj = cluster.get(name)
            status = obj.get("status") or {}
            if status.get("observedGeneration") != obj["metadata"]["generation"]:
                return False
            if len(cluster.children(name)) < CHILDREN:
                return False
            pods += sum(obj["spec"][role]["replicas"] for role in ("prefill", "decode", "router"))
        return len(cluster.items("v1", "Pod")) == pods

    wait_for("20 deployments with all their children and pods", settled, timeout=240)
    operator.settled()  # two reconcile passes in a row with no write

    def versions() -> dict[str, str]:
        # Only the DSV4Deployments: the children's status belongs to other controllers.
        return {name: cluster.get(name)["metadata"]["resourceVersion"] for name in names}

    before_versions = versions()
    server_before = quiet_plane.request_counts()
    ours_before = _our_counts(operator)
    time.sleep(IDLE_SECONDS)
    ours_after = _our_counts(operator)
    server_after = quiet_plane.request_counts()

    # Resyncs (every 2 s here) still ran, from the cache: 20 keys x 30 resyncs, give or take.
    assert ours_after["passes"] - ours_before["passes"] >= DEPLOYMENTS * 10
    delta = {k: ours_after[k] - ours_before[k] for k in ours_before if k != "passes"}
    # The optional kinds this plane lacks (ServiceMonitor, LeaderWorkerSet, DSV4Model) are
    # looked for 2, 4, 8 ... s apart, up to 300 s (runtime/cache.py `absent_recheck`): at
    # most 3 discovery reads each (14, 30, 62 s) in a minute that starts 7 s or more after
    # the operator.
    assert delta.pop("discovery") <= 3 * sum(w.optional for w in WATCHED), delta
    assert delta == {"writes": 0, "lists": 0, "gets": 0, "watch lists": 0}, delta
    server_delta = {
        (verb, res): server_after.get((verb, res), 0.0) - server_before.get((verb, res), 0.0)
        for verb, res in set(server_after) | set(server_before)
        # The operator never PUTs; the StatefulSet controller PUTs status while pods wait.
        if res in OUR_RESOURCES and verb in ("LIST", "POST", "PATCH", "APPLY", "DELETE")
    }
    assert {k: v for k, v in server_delta.items() if v} == {}
    assert versions() == before_versions


def test_a_repeated_event_is_aggregated(world: tuple[Cluster, OperatorProcess]) -> None:
    cluster, _ = world
    unsafe: dict[str, Any] = {
        "engine.indexKDtype": "bf16",
        "engine.hicache": {"enabled": True},
        "engine.capabilities": ["bf16IndexK"],
    }
    bad = example(cluster.namespace, **unsafe)
    good = example(cluster.namespace)

    def invalid_events() -> list[dict[str, Any]]:
        return [e for e in cluster.events() if e["reason"] == "Invalid"]

    cluster.apply(bad)
    wait_for("the Invalid event", lambda: invalid_events() or None, timeout=60)
    cluster.apply(good)
    wait_for(
        "the valid spec observed",
        lambda: (cluster.get().get("status") or {}).get("phase") != "Invalid" or None,
        timeout=60,
    )
    cluster.apply(bad)
    [event] = wait_for(
        "the same Invalid event, counted twice",
        lambda: [e for e in invalid_events() if e.get("count") == 2] or None,
        timeout=60,
    )
    assert len(invalid_events()) == 1
    assert event["lastTimestamp"] >= event["firstTimestamp"]

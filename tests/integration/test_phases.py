"""Phases and conditions against a real API server: a planned Recreate is Progressing at every
status write, never Degraded; a stuck deployment turns Degraded with the scheduler's reason,
then Failed once its progress deadline passes, as `kubectl get dsv4` shows."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, report_container_waiting, wait_for
from dsv4_devcluster.deployments import Cluster, example, rtx_pool, weights_volume
from dsv4_devcluster.operator import OperatorProcess
from tests.integration.cluster_support import kubectl_get_dsv4

pytestmark = pytest.mark.integration

BF16 = {"engine.indexKDtype": "bf16"}  # a transfer-format change: Recreate


@pytest.fixture(scope="module")
def phase_pool(control_plane: ControlPlane, dsv4_crd: dict[str, Any]) -> list[str]:
    return rtx_pool(control_plane, "phase-rtx", 2)


class StatusWrites:
    """Every status the API server stores for one DSV4Deployment, from a watch (no polling
    gap: each write is one event)."""

    def __init__(self, cluster: Cluster, name: str = "dsv4-flash") -> None:
        self.cluster, self.name = cluster, name
        self.seen: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            for event in self.cluster.dsv4.watch(
                namespace=self.cluster.namespace,
                name=self.name,
                resource_version=version,
                timeout=2,
            ):
                obj = event["raw_object"]
                version = obj["metadata"]["resourceVersion"]
                self.seen.append(obj.get("status") or {})

    def __enter__(self) -> StatusWrites:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _degraded(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == "Degraded"), {})


@pytest.fixture
def cluster(dyn: Any, namespace: str, phase_pool: list[str]) -> Iterator[Cluster]:
    yield Cluster(dyn, namespace)


@pytest.fixture
def slow_router(dyn: Any, namespace: str) -> Iterator[tuple[str, Any]]:
    """A PriorityClass for the router's pods and a ResourceQuota on it that admits no new
    router pod until the test raises it: the router comes up last, after the roles are ready,
    as a slow image pull or a busy node makes it (kwok would make it ready at once)."""
    classes = dyn.resources.get(api_version="scheduling.k8s.io/v1", kind="PriorityClass")
    name = f"router-{namespace}"[:63]
    classes.create(
        body={
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": 1000,
        }
    )
    quotas = dyn.resources.get(api_version="v1", kind="ResourceQuota")
    try:
        yield name, quotas
    finally:
        classes.delete(name=name)


def _router_quota(quotas: Any, namespace: str, priority_class: str, pods: int) -> None:
    quotas.server_side_apply(
        namespace=namespace,
        field_manager="tests",
        force_conflicts=True,
        body={
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "router-pods", "namespace": namespace},
            "spec": {
                "hard": {"pods": str(pods)},
                "scopeSelector": {
                    "matchExpressions": [
                        {
                            "scopeName": "PriorityClass",
                            "operator": "In",
                            "values": [priority_class],
                        }
                    ]
                },
            },
        },
    )


def test_a_planned_recreate_is_progressing_at_every_status_write(
    control_plane: ControlPlane,
    cluster: Cluster,
    operator: OperatorProcess,
    slow_router: tuple[str, Any],
) -> None:
    """A transfer-format change under Recreate stops the router and both roles on purpose and
    starts them again; the router comes up last. Every status the operator writes meanwhile
    is Progressing with Degraded=False (main wrote Degraded ReplicasUnavailable: router 0/1
    available once the roles were ready)."""
    priority_class, quotas = slow_router
    weights_volume(cluster.dyn, cluster.namespace)
    base: dict[str, Any] = {
        "rollout.strategy": "Recreate",
        "router.podTemplate": {"priorityClassName": priority_class},
    }
    cluster.apply(example(cluster.namespace, **base))
    old = cluster.wait_phase("Ready")["status"]["currentRevision"]
    _router_quota(quotas, cluster.namespace, priority_class, pods=0)
    with StatusWrites(cluster) as writes:
        cluster.apply(example(cluster.namespace, **base, **BF16))
        cluster.wait_events("Recreate")

        def roles_ready_router_not() -> bool:
            status = cluster.get().get("status", {})
            roles = status.get("roles", {})
            return status.get("observedGeneration") == 2 and all(
                roles.get(r, {}).get("ready") == 1 and roles[r].get("revision") != old
                for r in ("prefill", "decode")
            )

        wait_for("the new roles ready, the router held", roles_ready_router_not, timeout=120)
        print(kubectl_get_dsv4(control_plane, cluster.namespace))
        _router_quota(quotas, cluster.namespace, priority_class, pods=1)
        done = cluster.wait_phase("Ready", timeout=240)
        assert done["status"]["currentRevision"] != old
    print(kubectl_get_dsv4(control_plane, cluster.namespace))
    phases = [s.get("phase") for s in writes.seen]
    faults = [_degraded(s) for s in writes.seen if _degraded(s).get("status") == "True"]
    print("phases written:", phases)
    assert "Progressing" in phases
    assert faults == [] and not {"Degraded", "Failed"} & set(phases)
    # Every condition of every write carries a message.
    assert [
        c["type"] for s in writes.seen for c in s.get("conditions", []) if not c.get("message")
    ] == []


def test_a_stuck_deployment_is_degraded_then_failed_at_its_deadline(
    control_plane: ControlPlane, cluster: Cluster, operator: OperatorProcess
) -> None:
    """No claim for the weights: the scheduler keeps the engine pods Pending. Degraded says
    Unschedulable at once; after spec.progressDeadlineSeconds the phase is Failed with
    ProgressDeadlineExceeded, and `kubectl get dsv4` shows both."""
    cluster.apply(example(cluster.namespace, progressDeadlineSeconds=20))

    def degraded() -> dict[str, Any] | None:
        status = cluster.get().get("status", {})
        return status if _degraded(status).get("reason") == "Unschedulable" else None

    status = wait_for("Degraded Unschedulable", degraded, timeout=60)
    assert status["phase"] == "Degraded"
    assert 'persistentvolumeclaim "dsv4-weights" not found' in _degraded(status)["message"]
    listed = kubectl_get_dsv4(control_plane, cluster.namespace)
    print(listed)
    assert "Degraded" in listed and "Unschedulable" in listed

    def failed() -> dict[str, Any] | None:
        status = cluster.get().get("status", {})
        return status if status.get("phase") == "Failed" else None

    status = wait_for("phase Failed", failed, timeout=60)
    condition = _degraded(status)
    assert (condition["status"], condition["reason"]) == ("True", "ProgressDeadlineExceeded")
    assert "spec.progressDeadlineSeconds" in condition["message"]
    listed = kubectl_get_dsv4(control_plane, cluster.namespace)
    print(listed)
    assert "Failed" in listed and "ProgressDeadlineExceeded" in listed
    # The fix clears it: the claim lets the pods through and the rollout completes.
    weights_volume(cluster.dyn, cluster.namespace)
    cluster.wait_phase("Ready")
    assert _degraded(cluster.get()["status"])["status"] == "False"


def test_a_pod_that_cannot_pull_its_image_is_degraded_and_says_which(
    control_plane: ControlPlane, cluster: Cluster, operator: OperatorProcess
) -> None:
    """The kubelet reports ImagePullBackOff on the decode pod: Degraded names it at once
    (main read Progressing, or Ready=False only), and clears when the pod runs again."""
    weights_volume(cluster.dyn, cluster.namespace)
    cluster.apply(example(cluster.namespace))
    cluster.wait_phase("Ready")
    [pod] = cluster.pods("dsv4.io/role=decode")
    report_container_waiting(
        cluster.dyn,
        cluster.namespace,
        pod["metadata"]["name"],
        pod["spec"]["containers"][0]["name"],
        "ImagePullBackOff",
        'Back-off pulling image "registry.example.com/sglang:missing"',
    )

    def degraded() -> dict[str, Any] | None:
        status = cluster.get().get("status", {})
        return status if _degraded(status).get("reason") == "ImagePullBackOff" else None

    status = wait_for("Degraded ImagePullBackOff", degraded, timeout=60)
    assert status["phase"] == "Degraded"
    assert pod["metadata"]["name"] in _degraded(status)["message"]
    listed = kubectl_get_dsv4(control_plane, cluster.namespace)
    print(listed)
    assert "Degraded" in listed and "ImagePullBackOff" in listed

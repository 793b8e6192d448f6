"""Real kube-scheduler on kwok fake GPU nodes: pods land only on nodes of the requested GPU
product, a node's ``nvidia.com/gpu`` is never over-subscribed, and a test can drive a
container to OOMKilled the way a kubelet reports it."""

from __future__ import annotations

import functools
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from dsv4_devcluster import (
    GPU_PRODUCT_LABEL,
    MANUAL_STATUS_ANNOTATION,
    ControlPlane,
    report_container_terminated,
    wait_for,
    wait_pod_running,
)

pytestmark = pytest.mark.integration

RTX = "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
H100 = "NVIDIA-H100-80GB-HBM3"
POOL_LABEL = "devcluster.dsv4.io/pool"


@pytest.fixture
def gpu_pool(control_plane: ControlPlane, dyn: Any) -> Iterator[dict[str, Any]]:
    """Three fresh nodes for this test only: two RTX PRO 6000 x 8, one H100 x 8.

    They carry a pool label unique to the test; pods select it, so GPUs used by other tests
    (whose namespaces may still be terminating) cannot skew the arithmetic here.
    """
    pool = uuid.uuid4().hex[:8]
    names = {f"rtx-{pool}-0": RTX, f"rtx-{pool}-1": RTX, f"h100-{pool}-0": H100}
    for name, product in names.items():
        control_plane.add_gpu_node(name, gpus=8, product=product, labels={POOL_LABEL: pool})
    yield {"pool": pool, "nodes": names}
    nodes = dyn.resources.get(api_version="v1", kind="Node")
    for name in names:
        nodes.delete(name=name)


def gpu_pod(name: str, gpus: int, product: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "engine"}},
        "spec": {
            "nodeSelector": {GPU_PRODUCT_LABEL: product, POOL_LABEL: pool},
            "containers": [
                {
                    "name": "engine",
                    "image": "registry.example.com/dsv4-engine:test",
                    "resources": {
                        "limits": {"nvidia.com/gpu": str(gpus)},
                        "requests": {"cpu": "1", "memory": "1Gi"},
                    },
                }
            ],
        },
    }


def node_of(pods: Any, namespace: str, name: str) -> str | None:
    node: str | None = pods.get(name=name, namespace=namespace).spec.nodeName
    return node


def test_pods_land_only_on_nodes_of_requested_product(
    dyn: Any, namespace: str, gpu_pool: dict[str, Any]
) -> None:
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    pool, products = gpu_pool["pool"], gpu_pool["nodes"]
    wanted = {"h100-a": H100, "h100-b": H100, "rtx-a": RTX, "rtx-b": RTX, "rtx-c": RTX}
    for name, product in wanted.items():
        pods.create(body=gpu_pod(name, 2, product, pool), namespace=namespace)

    for name, product in wanted.items():
        bound = functools.partial(node_of, pods, namespace, name)
        node = wait_for(f"{name} bound", bound, timeout=120)
        assert products[node] == product, f"{name} wants {product}, landed on {node}"
        running = wait_pod_running(dyn, namespace, name, timeout=120)
        assert running["status"]["containerStatuses"][0]["ready"] is True


def test_gpus_are_never_oversubscribed(dyn: Any, namespace: str, gpu_pool: dict[str, Any]) -> None:
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    pool = gpu_pool["pool"]
    names = [f"engine-{i}" for i in range(5)]
    for name in names:  # 5 x 4 GPUs against 2 x 8 RTX GPUs: exactly one must stay Pending
        pods.create(body=gpu_pod(name, 4, RTX, pool), namespace=namespace)

    def outcome() -> tuple[list[str], list[str]] | None:
        bound, unschedulable = [], []
        for item in pods.get(namespace=namespace).items:
            if item.spec.nodeName:
                bound.append(item.metadata.name)
            elif any(
                c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                for c in item.status.conditions or []
            ):
                unschedulable.append(item.metadata.name)
        return (bound, unschedulable) if len(bound) + len(unschedulable) == 5 else None

    bound, unschedulable = wait_for("all 5 pods decided by the scheduler", outcome, timeout=180)
    assert len(bound) == 4 and len(unschedulable) == 1, (bound, unschedulable)

    per_node = Counter(node_of(pods, namespace, n) for n in bound)
    assert set(per_node) <= {n for n, p in gpu_pool["nodes"].items() if p == RTX}
    assert all(count * 4 <= 8 for count in per_node.values()), per_node

    [pending] = unschedulable
    pod = pods.get(name=pending, namespace=namespace)
    assert pod.status.phase == "Pending"
    [cond] = [c for c in pod.status.conditions if c.type == "PodScheduled"]
    assert "Insufficient nvidia.com/gpu" in cond.message

    events = dyn.resources.get(api_version="v1", kind="Event")

    def failed_scheduling() -> list[Any]:
        return [
            e
            for e in events.get(namespace=namespace).items
            if e.reason == "FailedScheduling" and e.involvedObject.name == pending
        ]

    wait_for("FailedScheduling event", failed_scheduling, timeout=60)

    # Freeing GPUs lets the scheduler place the pending pod: capacity is really accounted.
    pods.delete(name=bound[0], namespace=namespace, grace_period_seconds=0)
    wait_for(f"{pending} bound after GPUs freed", lambda: node_of(pods, namespace, pending), 180)


def test_container_can_be_driven_to_oomkilled(
    dyn: Any, namespace: str, gpu_pool: dict[str, Any]
) -> None:
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    pods.create(body=gpu_pod("decode-0", 4, RTX, gpu_pool["pool"]), namespace=namespace)
    wait_pod_running(dyn, namespace, "decode-0", timeout=120)

    report_container_terminated(dyn, namespace, "decode-0", "engine")

    def oom_reported() -> dict[str, Any] | None:
        pod = pods.get(name="decode-0", namespace=namespace).to_dict()
        [cs] = pod["status"]["containerStatuses"]
        return cs if (cs.get("lastState") or {}).get("terminated") else None

    cs = wait_for("OOMKilled in container status", oom_reported, timeout=30)
    assert cs["lastState"]["terminated"]["reason"] == "OOMKilled"
    assert cs["lastState"]["terminated"]["exitCode"] == 137
    assert cs["restartCount"] == 1
    assert cs["ready"] is False
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"

    # kwok must not "heal" the report: poke the pod so kwok sees an event, then re-read.
    pods.patch(
        name="decode-0",
        namespace=namespace,
        body={"metadata": {"labels": {"poked": "yes"}}},
        content_type="application/merge-patch+json",
    )
    wait_for(
        "label visible",
        lambda: pods.get(name="decode-0", namespace=namespace).metadata.labels.poked,
        timeout=30,
    )
    again = pods.get(name="decode-0", namespace=namespace).to_dict()
    [cs2] = again["status"]["containerStatuses"]
    assert cs2["lastState"]["terminated"]["reason"] == "OOMKilled"
    assert cs2["restartCount"] == 1
    ready = [c for c in again["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "False"

    # A second kill increments restartCount, as a kubelet would.
    report_container_terminated(dyn, namespace, "decode-0", "engine")
    final = pods.get(name="decode-0", namespace=namespace).to_dict()
    assert final["status"]["containerStatuses"][0]["restartCount"] == 2


def test_manual_status_pods_are_left_to_the_test(
    dyn: Any, namespace: str, gpu_pool: dict[str, Any]
) -> None:
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    manual = gpu_pod("manual", 1, H100, gpu_pool["pool"])
    key, value = MANUAL_STATUS_ANNOTATION
    manual["metadata"]["annotations"] = {key: value}
    pods.create(body=manual, namespace=namespace)
    wait_for("manual pod bound", functools.partial(node_of, pods, namespace, "manual"), 120)
    # A plain pod on the same node, created later, going Running shows kwok is live there.
    pods.create(body=gpu_pod("plain", 1, H100, gpu_pool["pool"]), namespace=namespace)
    wait_pod_running(dyn, namespace, "plain", timeout=120)

    status = pods.get(name="manual", namespace=namespace).to_dict()["status"]
    assert status["phase"] == "Pending"
    assert not status.get("podIP")
    assert not status.get("containerStatuses")

"""Core API semantics the operator relies on, proven against the real kube-apiserver and
kube-controller-manager: server-side apply idempotency, optimistic concurrency, garbage
collection through owner references, and the Deployment controller actually running."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.dynamic.exceptions import ConflictError

from dsv4_devcluster import wait_for

from .cluster_support import exists

pytestmark = pytest.mark.integration

FIELD_MANAGER = "dsv4-operator"


def statefulset(name: str, namespace: str, replicas: int = 1) -> dict[str, Any]:
    """A small engine-like StatefulSet, as the renderer would emit it."""
    labels = {"app.kubernetes.io/name": "dsv4", "app.kubernetes.io/instance": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "registry.example.com/dsv4-engine:test",
                            "args": ["--tp", "4"],
                            "ports": [{"name": "http", "containerPort": 30000}],
                            "resources": {"limits": {"nvidia.com/gpu": "4"}},
                        }
                    ]
                },
            },
        },
    }


def test_server_side_apply_twice_keeps_resource_version(dyn: Any, namespace: str) -> None:
    sts = dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    # replicas: 0 so the StatefulSet controller writes status once and then stays quiet:
    # its status writes also bump resourceVersion and would race the comparison below.
    body = statefulset("engine", namespace, replicas=0)

    def apply() -> Any:
        return sts.server_side_apply(
            body=body, name="engine", namespace=namespace, field_manager=FIELD_MANAGER
        )

    apply()

    def observed() -> bool:
        status = sts.get(name="engine", namespace=namespace).to_dict().get("status") or {}
        return bool(status.get("observedGeneration") == 1)

    wait_for("StatefulSet controller observed generation 1", observed, timeout=60)
    settled = sts.get(name="engine", namespace=namespace)

    first = apply()
    second = apply()

    assert settled.metadata.resourceVersion == first.metadata.resourceVersion
    assert first.metadata.resourceVersion == second.metadata.resourceVersion
    assert second.metadata.generation == 1
    assert FIELD_MANAGER in [m.manager for m in second.metadata.managedFields]

    # A real change does bump it, so the equality above is not vacuous.
    body["spec"]["template"]["spec"]["containers"][0]["args"] = ["--tp", "8"]
    third = apply()
    assert third.metadata.resourceVersion != second.metadata.resourceVersion
    assert third.metadata.generation == 2


def test_stale_resource_version_is_a_conflict(dyn: Any, namespace: str) -> None:
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    created = cms.create(
        body={"metadata": {"name": "rv"}, "data": {"k": "1"}}, namespace=namespace
    ).to_dict()
    stale = dict(created)
    cms.patch(
        name="rv",
        namespace=namespace,
        body={"data": {"k": "2"}},
        content_type="application/merge-patch+json",
    )

    stale["data"] = {"k": "3"}
    with pytest.raises(ConflictError) as info:
        cms.replace(body=stale, namespace=namespace)
    assert "the object has been modified" in str(info.value.body)


def test_deleting_owner_garbage_collects_children(dyn: Any, namespace: str) -> None:
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    sts = dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    owner = cms.create(body={"metadata": {"name": "owner"}}, namespace=namespace)
    owner_ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    child_cm = {"metadata": {"name": "child", "ownerReferences": [owner_ref]}}
    cms.create(body=child_cm, namespace=namespace)
    child_sts = statefulset("child-engine", namespace)
    child_sts["metadata"]["ownerReferences"] = [owner_ref]
    sts.create(body=child_sts, namespace=namespace)

    cms.delete(name="owner", namespace=namespace, propagation_policy="Background")

    def gone(resource: Any, name: str) -> bool:
        return not exists(resource, name, namespace)

    wait_for("child ConfigMap garbage-collected", lambda: gone(cms, "child"), timeout=120)
    wait_for("child StatefulSet garbage-collected", lambda: gone(sts, "child-engine"), timeout=120)


def test_foreground_deletion_waits_for_children(dyn: Any, namespace: str) -> None:
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    owner = cms.create(body={"metadata": {"name": "fg-owner"}}, namespace=namespace)
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "fg-owner",
        "uid": owner.metadata.uid,
        "blockOwnerDeletion": True,
    }
    cms.create(
        body={"metadata": {"name": "fg-child", "ownerReferences": [ref]}}, namespace=namespace
    )

    cms.delete(name="fg-owner", namespace=namespace, propagation_policy="Foreground")

    def both_gone() -> bool:
        names = {c.metadata.name for c in cms.get(namespace=namespace).items}
        return not names & {"fg-owner", "fg-child"}

    wait_for("foreground deletion of owner and child", both_gone, timeout=120)


def test_deployment_controller_creates_replicaset(dyn: Any, namespace: str) -> None:
    deployments = dyn.resources.get(api_version="apps/v1", kind="Deployment")
    replicasets = dyn.resources.get(api_version="apps/v1", kind="ReplicaSet")
    labels = {"app": "router"}
    deployments.create(
        namespace=namespace,
        body={
            "metadata": {"name": "router"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "router", "image": "router:test"}]},
                },
            },
        },
    )

    def owned_replicaset() -> list[Any]:
        return [
            rs
            for rs in replicasets.get(namespace=namespace).items
            if any(ref.name == "router" for ref in rs.metadata.ownerReferences or [])
        ]

    [rs] = wait_for("ReplicaSet owned by the Deployment", owned_replicaset, timeout=120)
    assert rs.spec.replicas == 1

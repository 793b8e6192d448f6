"""Fake GPU nodes for the dev cluster: kwok-managed Node objects with ``nvidia.com/gpu`` capacity.

A node made here carries the annotation kwok watches (``kwok.x-k8s.io/node=fake``), the
label ``nvidia.com/gpu.product=<product>`` (as NVIDIA's GPU feature discovery sets it) and
``nvidia.com/gpu: <n>`` in capacity and allocatable, so the real kube-scheduler accounts
GPUs exactly as on a cluster with the NVIDIA device plugin.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

from kubernetes.dynamic.exceptions import ConflictError

from dsv4_devcluster.kwok import NODE_ANNOTATION

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"


def gpu_node_manifest(
    name: str,
    gpus: int,
    product: str,
    *,
    labels: Mapping[str, str] | None = None,
    cpu: str = "128",
    memory: str = "1536Gi",
    pods: str = "110",
) -> dict[str, Any]:
    """The Node object :func:`create_gpu_node` submits (status included: kwok keeps it)."""
    resources = {"cpu": cpu, "memory": memory, "pods": pods, GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                GPU_PRODUCT_LABEL: product,
                GPU_COUNT_LABEL: str(gpus),
                **dict(labels or {}),
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
            },
        },
    }


def create_gpu_node(
    dyn: Any,
    name: str,
    gpus: int,
    product: str,
    *,
    labels: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Create the node, make sure its GPU capacity stuck, and wait until it is schedulable.

    ``dyn`` is a ``kubernetes.dynamic.DynamicClient``. Returns the node as a dict. A node of
    that name already there is kept (a module fixture may run twice on one control plane:
    pytest-xdist can come back to a module on the same worker).
    """
    nodes = dyn.resources.get(api_version="v1", kind="Node")
    manifest = gpu_node_manifest(name, gpus, product, labels=labels)
    with contextlib.suppress(ConflictError):
        nodes.create(body=manifest)
    # Status sent on create is kept by the API server; re-assert capacity in case kwok's
    # initial stage raced us with its defaults (which have no GPUs).
    nodes.status.patch(
        name=name,
        body={"status": {k: manifest["status"][k] for k in ("capacity", "allocatable")}},
        content_type="application/merge-patch+json",
    )
    deadline = time.monotonic() + timeout
    while True:
        node: dict[str, Any] = nodes.get(name=name).to_dict()
        if _schedulable(node, gpus):
            return node
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {name} not Ready/schedulable after {timeout}s: {node}")
        time.sleep(0.25)


def _schedulable(node: Mapping[str, Any], gpus: int) -> bool:
    status = node.get("status", {})
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )
    tainted = any(
        t.get("key", "").startswith("node.kubernetes.io/")
        for t in node.get("spec", {}).get("taints", []) or []
    )
    gpu_ok = status.get("allocatable", {}).get(GPU_RESOURCE) == str(gpus)
    return ready and not tainted and gpu_ok

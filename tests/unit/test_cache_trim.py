"""What the watch cache keeps of an object: a pod's spec only as far as PodView reads it."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf

from dsv4_operator.kube.resources import POD, STATEFULSET
from dsv4_operator.pods import PodView
from dsv4_operator.runtime.cache import WatchCache
from dsv4_operator.runtime.watched import WATCHED
from tests.support.builders import engine_pod

_FULL_SPEC: dict[str, Any] = {
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
    "nodeName": "gpu-0",
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    "containers": [{"name": "engine", "image": "sglang", "args": ["--tp", "8"]}],
    "volumes": [{"name": "weights", "emptyDir": {}}],
}


def _pod() -> dict[str, Any]:
    pod = copy.deepcopy(engine_pod("r1", {"reason": "OOMKilled", "exitCode": 137}))
    pod.update(apiVersion="v1", kind="Pod", spec=copy.deepcopy(_FULL_SPEC))
    pod["metadata"].update(namespace="ns", resourceVersion="5")
    pod["status"]["phase"] = "Running"
    pod["status"]["podIP"] = "10.0.0.7"
    return pod


def _cache() -> WatchCache:
    return WatchCache(kopf.OperatorSettings(), WATCHED, ["ns"], lambda *_: None)


def test_a_cached_pod_keeps_its_node_selector_and_status_and_its_view_is_unchanged() -> None:
    pod = _pod()
    cache = _cache()
    cache.observe(pod)
    cached = asyncio.run(cache.get(POD, "ns", "x-decode-0"))
    assert cached is not None
    assert cached["spec"] == {"nodeSelector": _FULL_SPEC["nodeSelector"]}
    assert cached["status"] == pod["status"] and cached["metadata"] == pod["metadata"]
    assert PodView.of(cached) == PodView.of(pod)
    assert pod["spec"] == _FULL_SPEC  # the object given is not changed


def test_other_kinds_keep_their_whole_spec() -> None:
    """A child's spec is compared with what the operator would apply (reconcile/diff.py)."""
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"namespace": "ns", "name": "d-decode", "resourceVersion": "3"},
        "spec": {"replicas": 1, "template": {"spec": copy.deepcopy(_FULL_SPEC)}},
    }
    cache = _cache()
    cache.observe(statefulset)
    cached = asyncio.run(cache.get(STATEFULSET, "ns", "d-decode"))
    assert cached is not None and cached["spec"] == statefulset["spec"]

"""The real LeaderWorkerSet controller in the dev control plane (multi-node roles): its groups
land on kwok GPU nodes with the LWS environment a multi-node engine reads, a failing or
deleted worker restarts its whole group, a DisaggregatedSet makes one LeaderWorkerSet per
role, exclusive topology keeps each group in one rack and each rack to one group, its
webhooks are wired (the API server calls them: an LWS the schema accepts but the
webhook refuses is refused), and a rendered object can be dry-run against them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import weights_volume
from dsv4_devcluster.kubelet import (
    finish_termination,
    hold_termination,
    report_container_terminated,
    wait_pod_running,
)
from dsv4_devcluster.lws import (
    DISAGGREGATED_SET_API_VERSION,
    LWS_API_VERSION,
    SUBGROUP_EXCLUSIVE_ANNOTATION,
    probe_lws,
)
from dsv4_operator.engine.validation import validate_object
from dsv4_operator.render.children import render_spec
from tests.support.builders import with_changes
from tests.support.paths import REPO

from .cluster_support import dry_run_apply

pytestmark = pytest.mark.integration

GPU_PRODUCT = "NVIDIA-H200"
GPUS_PER_NODE = 8
POOL_LABEL = "dsv4.test/pool"  # each test's own nodes: tests share the LWS control plane
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
SET_NAME = "leaderworkerset.sigs.k8s.io/name"


@pytest.fixture
def gpu_nodes(lws_control_plane: ControlPlane, lws_dyn: Any, lws_namespace: str) -> Iterator[str]:
    """Two kwok nodes of 8 GPUs each for this test only; yields their pool label value."""
    names = [f"{lws_namespace[:50]}-gpu-{i}" for i in range(2)]
    for name in names:
        lws_control_plane.add_gpu_node(
            name, GPUS_PER_NODE, GPU_PRODUCT, labels={POOL_LABEL: lws_namespace}
        )
    yield lws_namespace
    nodes = lws_dyn.resources.get(api_version="v1", kind="Node")
    for name in names:
        nodes.delete(name=name)


def group_lws(name: str, pool: str, size: int = 2) -> dict[str, Any]:
    """One group of ``size`` pods, each holding a whole 8-GPU node of ``pool``."""
    pod = {
        "spec": {
            "nodeSelector": {POOL_LABEL: pool},
            "containers": [
                {
                    "name": "engine",
                    "image": "registry.invalid/engine",
                    "resources": {"limits": {"nvidia.com/gpu": str(GPUS_PER_NODE)}},
                }
            ],
        }
    }
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": pod,
                "workerTemplate": pod,
            },
        },
    }


def group_pods(dyn: Any, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """worker index -> pod, for the pods of LWS ``name`` (not being deleted)."""
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    listed = pods.get(namespace=namespace, label_selector=f"{SET_NAME}={name}").to_dict()
    return {
        p["metadata"]["labels"][WORKER_INDEX]: p
        for p in listed["items"]
        if not p["metadata"].get("deletionTimestamp")
    }


def running_group(dyn: Any, namespace: str, name: str, size: int = 2) -> dict[str, dict[str, Any]]:
    """Wait until all ``size`` pods of the group run; return them by worker index."""
    found = wait_for(
        f"{size} pods of LWS {name}",
        lambda: (lambda g: g if len(g) == size else None)(group_pods(dyn, namespace, name)),
        timeout=120,
    )
    return {
        index: wait_pod_running(dyn, namespace, pod["metadata"]["name"], timeout=120)
        for index, pod in found.items()
    }


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    container = pod["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def create(dyn: Any, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    resource = dyn.resources.get(api_version=body["apiVersion"], kind=body["kind"])
    created: dict[str, Any] = resource.create(body=body, namespace=namespace).to_dict()
    return created


def test_group_pods_carry_the_leader_address_group_size_and_worker_index(
    lws_dyn: Any, lws_namespace: str, gpu_nodes: str
) -> None:
    create(lws_dyn, lws_namespace, group_lws("pro", gpu_nodes))
    group = running_group(lws_dyn, lws_namespace, "pro")

    assert sorted(group) == ["0", "1"]
    leader, worker = group["0"], group["1"]
    assert leader["metadata"]["name"] == "pro-0"
    assert worker["metadata"]["name"] == "pro-0-1"
    for index, pod in group.items():
        env = env_of(pod)
        assert env["LWS_LEADER_ADDRESS"] == f"pro-0.pro.{lws_namespace}", env
        assert env["LWS_GROUP_SIZE"] == "2", env
        assert env["LWS_WORKER_INDEX"] == index, env
        assert pod["metadata"]["labels"][GROUP_INDEX] == "0"
    # One whole 8-GPU node per pod: the group spans both nodes of its pool.
    assert {pod["spec"]["nodeName"] for pod in group.values()} == {
        f"{lws_namespace[:50]}-gpu-{i}" for i in range(2)
    }


def wait_group_recreated(
    dyn: Any, namespace: str, name: str, before: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Wait until every pod of the group is a new one (new UID) and runs again."""
    old = {pod["metadata"]["uid"] for pod in before.values()}

    def all_new() -> dict[str, dict[str, Any]] | None:
        group = group_pods(dyn, namespace, name)
        fresh = len(group) == len(before) and not old & {
            p["metadata"]["uid"] for p in group.values()
        }
        return group if fresh else None

    wait_for(f"every pod of LWS {name} recreated", all_new, timeout=120)
    return running_group(dyn, namespace, name, len(before))


def test_a_failed_worker_container_recreates_the_whole_group(
    lws_dyn: Any, lws_namespace: str, gpu_nodes: str
) -> None:
    create(lws_dyn, lws_namespace, group_lws("crash", gpu_nodes))
    before = running_group(lws_dyn, lws_namespace, "crash")

    # The worker's engine is OOM-killed and restarts (kubelet-style report: restartCount 1).
    report_container_terminated(lws_dyn, lws_namespace, before["1"]["metadata"]["name"], "engine")

    after = wait_group_recreated(lws_dyn, lws_namespace, "crash", before)
    assert after["0"]["metadata"]["name"] == before["0"]["metadata"]["name"]  # same names,
    assert after["0"]["metadata"]["uid"] != before["0"]["metadata"]["uid"]  # new pods


def test_deleting_a_worker_pod_recreates_the_whole_group(
    lws_dyn: Any, lws_namespace: str, gpu_nodes: str
) -> None:
    create(lws_dyn, lws_namespace, group_lws("gone", gpu_nodes))
    before = running_group(lws_dyn, lws_namespace, "gone")
    worker = before["1"]["metadata"]["name"]
    pods = lws_dyn.resources.get(api_version="v1", kind="Pod")

    # Terminating until LWS has acted, as under a real kubelet's grace period (see kwok.py).
    hold_termination(lws_dyn, lws_namespace, worker)
    try:
        pods.delete(name=worker, namespace=lws_namespace)
        leader_uid = before["0"]["metadata"]["uid"]
        wait_for(
            "the leader pod replaced after its worker was deleted",
            lambda: (
                group_pods(lws_dyn, lws_namespace, "gone")
                .get("0", {})
                .get("metadata", {})
                .get("uid", leader_uid)
                != leader_uid
            ),
            timeout=120,
        )
    finally:
        with contextlib.suppress(NotFoundError):
            finish_termination(lws_dyn, lws_namespace, worker)
    wait_group_recreated(lws_dyn, lws_namespace, "gone", before)


def disaggregated_set(name: str) -> dict[str, Any]:
    def role(role_name: str) -> dict[str, Any]:
        template = {"spec": {"containers": [{"name": "engine", "image": "registry.invalid/e"}]}}
        return {
            "name": role_name,
            "spec": {
                "replicas": 1,
                "leaderWorkerTemplate": {
                    "size": 2,
                    "leaderTemplate": template,
                    "workerTemplate": template,
                },
            },
        }

    return {
        "apiVersion": DISAGGREGATED_SET_API_VERSION,
        "kind": "DisaggregatedSet",
        "metadata": {"name": name},
        "spec": {"roles": [role("prefill"), role("decode")]},
    }


def test_a_disaggregated_set_creates_one_leader_worker_set_per_role(
    lws_dyn: Any, lws_namespace: str
) -> None:
    ds = create(lws_dyn, lws_namespace, disaggregated_set("pd"))
    sets = lws_dyn.resources.get(api_version=LWS_API_VERSION, kind="LeaderWorkerSet")

    def children() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = sets.get(
            namespace=lws_namespace, label_selector="disaggregatedset.x-k8s.io/name=pd"
        ).to_dict()["items"]
        return items if len(items) == 2 else None

    found = wait_for("the DisaggregatedSet's LeaderWorkerSets", children, timeout=120)
    roles = {lws["metadata"]["labels"]["disaggregatedset.x-k8s.io/role"]: lws for lws in found}
    assert sorted(roles) == ["decode", "prefill"]
    for lws in roles.values():
        owners = lws["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"]) for o in owners] == [
            ("DisaggregatedSet", ds["metadata"]["uid"])
        ]
        assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2


def test_the_lws_webhook_refuses_what_the_schema_lets_through(
    lws_dyn: Any, lws_namespace: str
) -> None:
    invalid = probe_lws("no-subgroups", annotations={SUBGROUP_EXCLUSIVE_ANNOTATION: "rack"})
    with pytest.raises(DynamicApiError) as refused:
        create(lws_dyn, lws_namespace, invalid)
    assert refused.value.status == 422 or "denied the request" in str(refused.value.body)
    assert "vleaderworkerset.kb.io" in str(refused.value.body)
    assert "subgroup-exclusive-topology without subGroupSize" in str(refused.value.body)
    # The mutating webhook ran too: it defaults what the CRD schema does not.
    created = create(lws_dyn, lws_namespace, probe_lws("defaulted"))
    template = created["spec"]["leaderWorkerTemplate"]
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert created["spec"]["networkConfig"]["subdomainPolicy"] == "Shared"


def test_a_dry_run_apply_returns_the_webhook_defaulted_object_and_stores_nothing(
    lws_dyn: Any, lws_namespace: str
) -> None:
    result = dry_run_apply(lws_dyn, lws_namespace, probe_lws("dry"))
    assert result["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    sets = lws_dyn.resources.get(api_version=LWS_API_VERSION, kind="LeaderWorkerSet")
    with pytest.raises(NotFoundError):
        sets.get(name="dry", namespace=lws_namespace)
    invalid = probe_lws("dry-bad", annotations={SUBGROUP_EXCLUSIVE_ANNOTATION: "rack"})
    with pytest.raises(AssertionError, match="subgroup-exclusive-topology without subGroupSize"):
        dry_run_apply(lws_dyn, lws_namespace, invalid)


RACK_LABEL = "dsv4.test/rack"  # a fabric domain label, as a rack or NVLink clique label is


def test_exclusive_topology_puts_each_group_on_nodes_of_one_rack_and_one_group_per_rack(
    lws_control_plane: ControlPlane, lws_dyn: Any, lws_namespace: str
) -> None:
    """The operator's own rendering of DSV4-Pro prefill (2 groups of 2 whole H200 nodes) with
    spec.gpu.exclusiveTopology: on two racks of two nodes each, the LWS controller puts each
    group on the nodes of one rack, and the other group on the other rack."""
    racks = ("rack-a", "rack-b")
    for rack in racks:
        for i in range(2):
            lws_control_plane.add_gpu_node(
                f"{lws_namespace}-{rack}-{i}",
                GPUS_PER_NODE,
                GPU_PRODUCT,
                labels={POOL_LABEL: lws_namespace, RACK_LABEL: rack},
            )
    weights_volume(lws_dyn, lws_namespace, claim="dsv4-pro-weights")
    doc = yaml.safe_load((REPO / "examples" / "dsv4-pro-pd-h200.yaml").read_text())
    doc["metadata"] = {"name": "dsv4-pro", "namespace": lws_namespace}
    doc = with_changes(
        doc,
        {
            "spec.gpu.exclusiveTopology": RACK_LABEL,
            "spec.prefill.replicas": 2,
            "spec.prefill.nodeSelector": {POOL_LABEL: lws_namespace},
        },
    )
    validation = validate_object(doc)
    assert validation.valid and validation.spec is not None, validation.errors
    [prefill] = [
        c
        for c in render_spec("dsv4-pro", lws_namespace, validation.spec)
        if c["kind"] == "LeaderWorkerSet" and c["metadata"]["name"] == "dsv4-pro-prefill"
    ]
    create(lws_dyn, lws_namespace, prefill)
    pods = lws_dyn.resources.get(api_version="v1", kind="Pod")

    def scheduled() -> list[dict[str, Any]] | None:
        listed = pods.get(namespace=lws_namespace, label_selector=f"{SET_NAME}=dsv4-pro-prefill")
        items: list[dict[str, Any]] = listed.to_dict()["items"]
        placed = [p for p in items if p["spec"].get("nodeName")]
        return placed if len(placed) == 4 else None

    placed = wait_for("4 pods of dsv4-pro-prefill scheduled", scheduled, timeout=120)
    rack_of = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(RACK_LABEL)
        for n in lws_dyn.resources.get(api_version="v1", kind="Node")
        .get(label_selector=f"{POOL_LABEL}={lws_namespace}")
        .to_dict()["items"]
    }
    groups: dict[str, set[str | None]] = {}
    for pod in placed:
        group = pod["metadata"]["labels"][GROUP_INDEX]
        groups.setdefault(group, set()).add(rack_of[pod["spec"]["nodeName"]])
        # What LWS made of the annotation: the leader an affinity on the rack label (its pod
        # webhook), the workers a node selector on their leader's rack (its pod controller).
        if pod["metadata"]["labels"][WORKER_INDEX] == "0":
            terms = pod["spec"]["affinity"]["podAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            assert [t["topologyKey"] for t in terms] == [RACK_LABEL], terms
        else:
            assert pod["spec"]["nodeSelector"][RACK_LABEL] == rack_of[pod["spec"]["nodeName"]]
    assert sorted(groups) == ["0", "1"]
    assert all(len(r) == 1 for r in groups.values()), groups  # one rack per group
    assert {r for rs in groups.values() for r in rs} == set(racks), groups  # one group per rack

"""Multi-node roles rendered as LeaderWorkerSet groups: flags from the LWS environment, every
pod on the pinned GPU product, whole-group restarts, Services on leaders only, and single-node
roles exactly as before."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dsv4_operator.api.limits import DIST_INIT_PORT
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.validation import validate_object
from dsv4_operator.render.children import render_spec
from dsv4_operator.render.context import OwnerRef, build_context
from tests.support.builders import example_doc, with_changes
from tests.support.paths import REPO

GOLDEN = REPO / "tests" / "unit" / "golden" / "dsv4-multinode-children.yaml"
OWNER = OwnerRef("dsv4.io/v1alpha1", "DSV4Deployment", "dsv4-pro", "0000-uid")
# Each role: TP16 over two nodes of 8 GPUs (the 2 nodes x 8 GPUs per role).
TWO_NODES = {"prefill.tensorParallel": 16, "decode.tensorParallel": 16}
# The LeaderWorkerSets of the same spec with exclusive topology on an NVLink-domain label.
GOLDEN_EXCLUSIVE = REPO / "tests" / "unit" / "golden" / "dsv4-multinode-exclusive-lws.yaml"
NVLINK_DOMAIN = "nvidia.com/gpu.clique"
EXCLUSIVE = {**TWO_NODES, "gpu.exclusiveTopology": NVLINK_DOMAIN}
EXCLUSIVE_ANNOTATION = "leaderworkerset.sigs.k8s.io/exclusive-topology"


def _spec(changes: dict[str, Any]) -> DSV4DeploymentSpec:
    return DSV4DeploymentSpec.model_validate(with_changes(example_doc()["spec"], changes))


def _render(changes: dict[str, Any]) -> list[dict[str, Any]]:
    return render_spec("dsv4-pro", "default", _spec(changes), OWNER)


def _by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def _golden_text() -> str:
    return yaml.safe_dump_all(_render(TWO_NODES), sort_keys=True, width=100)


def _golden_exclusive_text() -> str:
    groups = [o for o in _render(EXCLUSIVE) if o["kind"] == "LeaderWorkerSet"]
    return yaml.safe_dump_all(groups, sort_keys=True, width=100)


@pytest.mark.parametrize(
    ("golden", "text"), [(GOLDEN, _golden_text), (GOLDEN_EXCLUSIVE, _golden_exclusive_text)]
)
def test_golden_multinode_children(golden: Any, text: Any) -> None:
    assert golden.read_text() == text(), (
        "rendered multi-node children changed; if intended, regenerate with "
        "`python -m tests.unit.test_render_groups` and review the diff"
    )


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_role_spanning_two_nodes_is_one_leader_worker_set_of_groups_of_two(role: str) -> None:
    objs = _render(TWO_NODES)
    assert not [o for o in objs if o["kind"] == "StatefulSet"]
    lws = _by(objs, "LeaderWorkerSet", f"dsv4-pro-{role}")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 1
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = template["leaderTemplate"], template["workerTemplate"]
    for pod in (leader, worker):
        assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == (
            "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
        )
        engine = pod["spec"]["containers"][0]
        # Each pod holds one node's share of the replica's 16 GPUs.
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == 8
        command = engine["command"]
        assert command[command.index("--tp-size") + 1] == "16"
        assert command[command.index("--dist-init-addr") + 1] == (
            f"$(LWS_LEADER_ADDRESS):{DIST_INIT_PORT}"
        )
        assert command[command.index("--nnodes") + 1] == "$(LWS_GROUP_SIZE)"
        assert command.count("--nnodes") == 1  # the engine argv's own --nnodes, replaced
        assert command[command.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    # Only the leader serves HTTP: only it has ports and probes.
    assert "readinessProbe" in leader["spec"]["containers"][0]
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
        assert key not in worker["spec"]["containers"][0]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_role_service_targets_group_leaders_only(role: str) -> None:
    objs = _render(TWO_NODES)
    service = _by(objs, "Service", f"dsv4-pro-{role}")
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    # The leaders' DNS names are the ones a StatefulSet's pods had: the router's URLs stand.
    router = _by(objs, "Deployment", "dsv4-pro-router")
    argv = " ".join(router["spec"]["template"]["spec"]["containers"][0]["command"])
    assert f"http://dsv4-pro-{role}-0.dsv4-pro-{role}.default.svc:30000" in argv


def test_a_single_node_role_beside_a_multi_node_one_stays_a_statefulset() -> None:
    objs = _render({"prefill.tensorParallel": 16})
    assert _by(objs, "LeaderWorkerSet", "dsv4-pro-prefill")
    sts = _by(objs, "StatefulSet", "dsv4-pro-decode")
    assert "--nnodes" not in sts["spec"]["template"]["spec"]["containers"][0]["command"]
    decode_service = _by(objs, "Service", "dsv4-pro-decode")
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in decode_service["spec"]["selector"]


def test_external_scaling_leaves_the_group_count_to_the_autoscaler() -> None:
    objs = _render({**TWO_NODES, "decode.scaling": "External"})
    assert "replicas" not in _by(objs, "LeaderWorkerSet", "dsv4-pro-decode")["spec"]
    assert _by(objs, "LeaderWorkerSet", "dsv4-pro-prefill")["spec"]["replicas"] == 1


def test_the_same_gpus_on_other_nodes_is_another_revision_single_node_hashes_stand() -> None:
    two = build_context("x", "ns", _spec(TWO_NODES))
    one = build_context("x", "ns", _spec({**TWO_NODES, "gpu.perNode": 16}))
    assert two.nodes_of("prefill") == 2 and one.nodes_of("prefill") == 1
    assert two.revision != one.revision
    # Nodes enter the hash only past one node: every single-node revision keeps its hash
    # (the golden file of the example pins it too).
    plain = build_context("x", "ns", _spec({}))
    assert plain.nodes == {}


def test_exclusive_topology_annotates_every_group_set_and_nothing_else() -> None:
    plain, exclusive = _render(TWO_NODES), _render(EXCLUSIVE)
    for role in ("prefill", "decode"):
        lws = _by(exclusive, "LeaderWorkerSet", f"dsv4-pro-{role}")
        assert lws["metadata"]["annotations"][EXCLUSIVE_ANNOTATION] == NVLINK_DOMAIN
        before = _by(plain, "LeaderWorkerSet", f"dsv4-pro-{role}")
        assert EXCLUSIVE_ANNOTATION not in before["metadata"]["annotations"]
        # Placement, like a node selector: no new revision, no new templates.
        assert lws["metadata"]["labels"] == before["metadata"]["labels"]
        assert lws["spec"] == before["spec"]


def test_a_single_node_role_ignores_exclusive_topology() -> None:
    objs = _render({"prefill.tensorParallel": 16, "gpu.exclusiveTopology": NVLINK_DOMAIN})
    assert (
        EXCLUSIVE_ANNOTATION
        in _by(objs, "LeaderWorkerSet", "dsv4-pro-prefill")["metadata"]["annotations"]
    )
    decode = _by(objs, "StatefulSet", "dsv4-pro-decode")
    assert EXCLUSIVE_ANNOTATION not in decode["metadata"]["annotations"]
    assert decode == _by(_render({"prefill.tensorParallel": 16}), "StatefulSet", "dsv4-pro-decode")


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("kubernetes.io/hostname", "each pod of a group needs a whole node"),
        ("Example.com/rack", "the prefix before '/' must be a lowercase DNS subdomain"),
        ("example.com/-rack", "the name part must be 1-63 characters"),
        ("example.com/" + "r" * 64, "the name part must be 1-63 characters"),
    ],
)
def test_an_exclusive_topology_that_is_no_shared_node_label_key_is_refused(
    key: str, why: str
) -> None:
    doc = with_changes(
        example_doc(),
        {"spec.gpu.exclusiveTopology": key, **{f"spec.{k}": v for k, v in TWO_NODES.items()}},
    )
    errors = {f.field: f.message for f in validate_object(doc).errors}
    assert why in errors["spec.gpu.exclusiveTopology"], errors


if __name__ == "__main__":  # regenerate the golden files
    GOLDEN.write_text(_golden_text())
    GOLDEN_EXCLUSIVE.write_text(_golden_exclusive_text())

"""A role replica spans nodes when its parallelism needs more GPUs than one node has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.topology import (
    dist_init_addr,
    gpus_per_pod,
    nodes_per_replica,
    role_topology,
)
from dsv4_operator.engine.validation import validate_spec

H200 = {"gpu.product": "NVIDIA-H200", "gpu.perNode": 8}


def _spec(doc: dict[str, Any]) -> DSV4DeploymentSpec:
    return DSV4DeploymentSpec.model_validate(doc)


def _r007(doc: dict[str, Any]) -> list[str]:
    return [f.message for f in validate_spec(doc).findings if f.rule == "DSV4-R007"]


def test_single_node_replica_is_one_pod(variant: Callable[..., dict[str, Any]]) -> None:
    spec = _spec(variant({}))
    assert nodes_per_replica(spec, "decode") == 1
    assert gpus_per_pod(spec, "decode") == spec.decode.tensor_parallel
    assert not role_topology(spec, "decode").multi_node


@pytest.mark.parametrize(("tp", "nodes"), [(16, 2), (32, 4), (8, 1)])
def test_tensor_parallel_across_nodes(
    variant: Callable[..., dict[str, Any]], tp: int, nodes: int
) -> None:
    doc = variant({**H200, "prefill.tensorParallel": tp})
    spec = _spec(doc)
    assert nodes_per_replica(spec, "prefill") == nodes
    assert gpus_per_pod(spec, "prefill") == 8
    assert _r007(doc) == []


def test_dp_attention_and_expert_parallel_share_the_tensor_parallel_gpus(
    variant: Callable[..., dict[str, Any]],
) -> None:
    doc = variant(
        {
            **H200,
            "decode.tensorParallel": 16,
            "decode.attentionDataParallel": 16,
            "decode.expertParallel": 16,
            "decode.moeAllToAll": "deepep",
        }
    )
    topology = role_topology(_spec(doc), "decode")
    assert (topology.gpus_per_replica, topology.nodes, topology.gpus_per_pod) == (16, 2, 8)


def test_gpus_that_do_not_fill_whole_nodes_are_refused(
    variant: Callable[..., dict[str, Any]],
) -> None:
    doc = variant({**H200, "prefill.tensorParallel": 12})
    assert not role_topology(_spec(doc), "prefill").spans_whole_nodes
    (message,) = _r007(doc)
    assert "not a multiple" in message and "Use 8 or 16 GPUs" in message
    assert not validate_spec(doc).valid


def test_multi_node_data_parallel_needs_dp_attention(
    variant: Callable[..., dict[str, Any]],
) -> None:
    # sglang check_server_args: "multi-node data parallel is not supported unless dp attention!"
    plain = variant(
        {**H200, "decode.tensorParallel": 8, "decode.overrides.extraArgs": ["--dp", "2"]}
    )
    assert any("without DP attention" in m for m in _r007(plain))
    attention = variant({**H200, "decode.tensorParallel": 16, "decode.attentionDataParallel": 2})
    assert _r007(attention) == []


def test_more_nodes_than_a_group_may_have_are_refused(
    variant: Callable[..., dict[str, Any]],
) -> None:
    doc = variant({**H200, "gpu.perNode": 1, "decode.tensorParallel": 32})
    assert any("at most 16" in m for m in _r007(doc))


def test_dist_init_addr_names_the_leader_port() -> None:
    assert dist_init_addr("dsv4-prefill-0.dsv4-prefill") == "dsv4-prefill-0.dsv4-prefill:20000"


@pytest.mark.parametrize("flag", ["--nnodes", "--node-rank", "--dist-init-addr"])
def test_multi_node_flags_stay_the_operators(
    variant: Callable[..., dict[str, Any]], flag: str
) -> None:
    doc = variant({"engine.extraArgs": [flag, "1"]})
    messages = [f.message for f in validate_spec(doc).findings]
    assert any(flag in m and "spans nodes" in m for m in messages)


def _argv(doc: dict[str, Any], role: str) -> list[str]:
    result = validate_spec(doc)
    assert result.spec is not None and result.plan is not None, result.findings
    from dsv4_operator.engine.flags import engine_launch

    return list(engine_launch(result.spec, result.plan, role, "m").command)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "attention"),
    [
        ("0.5.16", ["--dp-size", "16", "--enable-dp-attention"]),
        ("0.5.23", ["--attn-dp-size", "16"]),
    ],
)
def test_multi_node_argv_spells_the_parallelism_for_the_release(
    variant: Callable[..., dict[str, Any]], version: str, attention: list[str]
) -> None:
    doc = variant(
        {
            **H200,
            "engine.sglangVersion": version,
            "engine.capabilities": [],
            "decode.tensorParallel": 16,
            "decode.attentionDataParallel": 16,
            "decode.expertParallel": 16,
            "decode.moeAllToAll": "deepep",
        }
    )
    argv = _argv(doc, "decode")
    start = argv.index("--tp-size")
    assert argv[start : start + 2 + len(attention) + 6] == [
        "--tp-size", "16", *attention,
        "--ep-size", "16", "--moe-a2a-backend", "deepep", "--nnodes", "2",
    ]  # fmt: skip
    assert "--node-rank" not in argv and "--dist-init-addr" not in argv


def test_single_node_argv_has_no_multi_node_flags(variant: Callable[..., dict[str, Any]]) -> None:
    argv = _argv(variant({}), "prefill")
    for flag in ("--nnodes", "--ep-size", "--moe-a2a-backend", "--attn-dp-size"):
        assert flag not in argv


def test_eager_fallback_counts_each_attention_group_s_batch(
    variant: Callable[..., dict[str, Any]],
) -> None:
    # each DP-attention group runs maxRunningRequests / dp requests under its own graphs
    base = {**H200, "decode.tensorParallel": 16, "engine.cudaGraphMaxBs": 16}
    quiet = variant({**base, "decode.attentionDataParallel": 16, "engine.maxRunningRequests": 256})
    loud = variant({**base, "decode.attentionDataParallel": 8, "engine.maxRunningRequests": 256})
    assert "DSV4-R006" not in {f.rule for f in validate_spec(quiet).findings}
    assert "DSV4-R006" in {f.rule for f in validate_spec(loud).findings}


def test_expert_parallel_that_does_not_divide_tp_is_refused(
    variant: Callable[..., dict[str, Any]],
) -> None:
    # distributed/parallel_state.py floors moe_tp_size = tp // ep: the MoE groups break
    loud = variant({**H200, "decode.tensorParallel": 16, "decode.expertParallel": 6})
    quiet = variant({**H200, "decode.tensorParallel": 16, "decode.expertParallel": 8})
    findings = validate_spec(loud).findings
    assert any(f.rule == "DSV4-R025" and "expert-parallel" in f.message for f in findings)
    assert "DSV4-R025" not in {f.rule for f in validate_spec(quiet).findings}

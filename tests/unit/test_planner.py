"""Planner: each release's DSV4 pool arithmetic with the real index-K size (engine notes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.planner import GIB, PlanningError, plan
from dsv4_operator.engine.pools import (
    PoolSettings,
    _c128_state_fixed_bytes,
    indexer_bytes_per_token,
)
from dsv4_operator.engine.profiles import model_profiles

V4 = "deepseek-v4-flash"


def _plan(spec: dict[str, Any]) -> Any:
    return plan(DSV4DeploymentSpec.model_validate(spec))


def test_indexer_bytes_per_dtype() -> None:
    assert indexer_bytes_per_token("fp8", 128) == 132
    assert indexer_bytes_per_token("bf16", 128) == 256
    assert indexer_bytes_per_token("fp4", 128) == 68


def test_v4_flash_worked_example_pool_by_pool(example_spec: DSV4DeploymentSpec) -> None:
    decode = plan(example_spec).roles["decode"]
    pools = decode.sizing.per_token
    # SGLang 0.5.16: 2511 + 3066 + 91 + 693 + 1075 + 269 ~= 7705 B per full token
    assert pools["swa"] == pytest.approx(0.1 * 584 * 43)
    assert pools["c4"] == pytest.approx(584 * 21 / 4)
    assert pools["c128"] == pytest.approx(584 * 20 / 128)
    assert pools["indexer"] == pytest.approx(0.25 * 132 * 21)
    assert pools["c4State"] == pytest.approx(0.1 * 8 / 128 * 8192 * 21)
    assert pools["c4IndexerState"] == pytest.approx(0.1 * 8 / 128 * 2048 * 21)
    assert decode.bytes_per_full_token == pytest.approx(7705.45, abs=0.01)
    assert decode.bytes_per_full_token == pytest.approx(sum(pools.values()))


def test_bf16_index_k_adds_651_bytes_and_1_1_gb_at_1_7m_tokens(
    variant: Callable[..., dict[str, Any]],
) -> None:
    fp8 = _plan(variant({})).roles["decode"]
    bf16 = _plan(variant({"engine.indexKDtype": "bf16", "engine.capabilities": []})).roles["decode"]
    extra = bf16.bytes_per_full_token - fp8.bytes_per_full_token
    assert extra == pytest.approx(0.25 * (256 - 132) * 21)  # 651 B
    assert round(extra) == 651
    # The production figure: ~1.1 GB per rank at ~1.7 M full tokens.
    assert 1.7e6 * extra / 1e9 == pytest.approx(1.1, abs=0.02)
    # Without poolSizingFix the engine estimates with 132 B; the over-commit is that gap.
    assert bf16.engine_bytes_per_full_token == pytest.approx(fp8.bytes_per_full_token)
    assert bf16.unpatched_overcommit_bytes > 0
    # The pinned token count uses the true size, so it is lower.
    assert bf16.max_total_tokens < fp8.max_total_tokens


def test_pool_sizing_fix_means_no_overcommit(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant(
        {"engine.indexKDtype": "bf16", "engine.capabilities": ["bf16IndexK", "poolSizingFix"]}
    )
    p = _plan(spec).roles["decode"]
    assert p.engine_bytes_per_full_token == p.bytes_per_full_token
    assert p.unpatched_overcommit_bytes == 0


def test_fp4_over_reserves_safely(variant: Callable[..., dict[str, Any]]) -> None:
    p = _plan(variant({"engine.indexKDtype": "fp4", "engine.capabilities": []})).roles["decode"]
    assert p.indexer_bytes_per_token == 68
    assert p.bytes_per_full_token < p.engine_bytes_per_full_token
    assert p.unpatched_overcommit_bytes == 0
    # The engine keeps its own (smaller) estimate over a larger --max-total-tokens.
    assert p.max_total_tokens == p.engine_sizing.full_tokens(p.available_bytes, 256)


def test_max_total_tokens_from_budget(example_spec: DSV4DeploymentSpec) -> None:
    p = plan(example_spec).roles["decode"]
    assert p.static_budget_bytes == int(0.85 * 96 * GIB)
    assert p.weights_bytes == int(145 * GIB / 4)
    assert p.kv_pool_bytes == p.static_budget_bytes - p.weights_bytes - p.reserve_bytes
    assert p.max_total_tokens % 256 == 0
    assert p.max_total_tokens <= p.kv_pool_bytes / p.bytes_per_full_token
    assert p.max_total_tokens > p.kv_pool_bytes / p.bytes_per_full_token - 256
    assert p.sessions_capacity == p.max_total_tokens // 80000


SETTINGS = PoolSettings(
    indexer_bytes=132,
    state_bytes=4,
    speculative=False,
    max_running_requests=64,
    mode="decode",
    decode_extra_slots=0,
)


def test_c128_state_fixed_matches_engine_formula() -> None:
    model = model_profiles()[V4]
    # 65 slots (64 running + 1): rows = ceil((65*128 + 128 + 1) / 128) * 128 = 8576
    assert _c128_state_fixed_bytes(model, SETTINGS) == 8576 * 2 * 512 * 4 * 20
    # PD decode with a small batch adds 2x the batch of in-transfer slots
    small = dataclasses.replace(SETTINGS, max_running_requests=16, decode_extra_slots=32)
    # 49 slots: rows = ceil((49*128 + 128 + 1) / 128) * 128 = 6528
    assert _c128_state_fixed_bytes(model, small) == 6528 * 2 * 512 * 4 * 20


def test_0_5_23_pads_rows_to_pages_and_prices_state_per_storage_page(
    variant: Callable[..., dict[str, Any]],
) -> None:
    p = _plan(variant({"engine.sglangVersion": "0.5.23", "engine.capabilities": []}))
    decode = p.roles["decode"]
    pools = decode.sizing.per_token
    # SWA: 0.1 x (43 x 585 + 21 x 8/256 x 10,240); rows of 584 B padded to 576-byte strides
    assert pools["swa"] == pytest.approx(0.1 * (43 * 585 + 21 * 8 / 256 * 10240))
    assert pools["c4"] == pytest.approx(21 * 585 / 4)
    assert pools["c128"] == pytest.approx(20 * 864 / 128)
    assert decode.bytes_per_full_token == pytest.approx(7086.75)
    assert decode.max_total_tokens > _plan(variant({})).roles["decode"].max_total_tokens


def test_unknown_release_names_the_supported_ones(variant: Callable[..., dict[str, Any]]) -> None:
    with pytest.raises(PlanningError) as info:
        _plan(variant({"engine.sglangVersion": "0.5.9"}))
    assert info.value.field == "spec.engine.sglangVersion"
    assert "0.5.23" in info.value.message and "0.5.16" in info.value.message


def test_speculative_inflates_by_draft_layer(variant: Callable[..., dict[str, Any]]) -> None:
    base = _plan(variant({})).roles["decode"].bytes_per_full_token
    eagle = ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"]
    eagle += ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"]
    spec = _plan(variant({"engine.extraArgs": eagle}))
    # ring 16 doubles the c4 state; then (43 + 1) / 43 for the draft layer
    pools = spec.roles["decode"].sizing.per_token
    assert pools["c4State"] == pytest.approx(0.1 * 16 / 128 * 8192 * 21 * 44 / 43)
    assert spec.roles["decode"].bytes_per_full_token > base


def test_bf16_compress_state_halves_state_pools(variant: Callable[..., dict[str, Any]]) -> None:
    env = [{"name": "SGLANG_DSV4_COMPRESS_STATE_DTYPE", "value": "bfloat16"}]
    pools = _plan(variant({"engine.env": env})).roles["decode"].sizing.per_token
    assert pools["c4State"] == pytest.approx(0.1 * 8 / 128 * 8192 * 21 / 2)


def test_overrides_of_gpu_memory_and_weights(variant: Callable[..., dict[str, Any]]) -> None:
    base = _plan(variant({})).roles["decode"]
    bigger = _plan(variant({"gpu.memoryGiB": 141})).roles["decode"]
    lighter = _plan(variant({"model.weightsGiB": 100})).roles["decode"]
    assert bigger.max_total_tokens > base.max_total_tokens
    assert lighter.weights_bytes == int(100 * GIB / 4)
    assert lighter.max_total_tokens > base.max_total_tokens


def test_role_override_of_mem_fraction(variant: Callable[..., dict[str, Any]]) -> None:
    p = _plan(variant({"decode.overrides": {"memFractionStatic": 0.8}}))
    assert p.roles["decode"].max_total_tokens < p.roles["prefill"].max_total_tokens


def test_v32_cell_size_and_does_not_fit_on_four_rtx(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant({"model.profile": "deepseek-v3.2", "model.checkpoint": "fp8"})
    p = _plan(spec).roles["decode"]
    assert p.bytes_per_full_token == (656 + 132) * 61
    assert not p.fits
    roomy = variant(
        {
            "model.profile": "deepseek-v3.2",
            "model.checkpoint": "fp8",
            "gpu.product": "NVIDIA-B200",
            "decode.tensorParallel": 8,
            "prefill.tensorParallel": 8,
        }
    )
    assert _plan(roomy).roles["decode"].fits


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model.profile": "llama"}, "spec.model.profile"),
        ({"gpu.product": "NVIDIA-A100"}, "spec.gpu.product"),
        ({"model.checkpoint": "int4"}, "spec.model.checkpoint"),
    ],
)
def test_unknown_profiles_name_the_field(
    variant: Callable[..., dict[str, Any]], change: dict[str, str], field: str
) -> None:
    with pytest.raises(PlanningError) as info:
        _plan(variant(change))
    assert info.value.field == field


def test_unknown_gpu_with_memory_is_planned(variant: Callable[..., dict[str, Any]]) -> None:
    p = _plan(variant({"gpu.product": "NVIDIA-A100", "gpu.memoryGiB": 80}))
    assert p.roles["decode"].gpu_memory_bytes == 80 * GIB


PRO_H200 = "examples/dsv4-pro-pd-h200.yaml"


def _pro_example() -> dict[str, Any]:
    import yaml

    from tests.support.paths import REPO

    doc: dict[str, Any] = yaml.safe_load((REPO / PRO_H200).read_text("utf-8"))["spec"]
    return doc


def test_dp_attention_replicates_the_non_expert_weights_across_attention_groups() -> None:
    pro = model_profiles()["deepseek-v4-pro"]
    planned = _plan(_pro_example())
    prefill, decode = planned.roles["prefill"], planned.roles["decode"]
    weights = pro.checkpoints["fp4-experts"]
    # prefill: attention TP16, every weight over 16 ranks
    assert prefill.weights_bytes == int(weights * GIB / 16)
    # decode: DP attention 16 leaves an attention-TP group of 1 rank holding all non-experts
    expected = (weights - pro.non_expert_weights_gib) * GIB / 16 + pro.non_expert_weights_gib * GIB
    assert decode.weights_bytes == int(expected)
    assert (decode.nodes_per_replica, decode.gpus_per_pod, decode.attention_data_parallel) == (
        2,
        8,
        16,
    )


def test_each_attention_dp_group_holds_its_own_sessions() -> None:
    decode = _plan(_pro_example()).roles["decode"]
    assert decode.sessions_capacity == 16 * (decode.max_total_tokens // 80000)

"""Profiles are data with a source for every number."""

from __future__ import annotations

import pytest

from dsv4_operator.engine.profiles import GpuProfile, ModelProfile, gpu_profiles, model_profiles


def _numeric_fields(profile: ModelProfile | GpuProfile) -> list[str]:
    data = profile.model_dump(by_alias=True)
    return [
        key
        for key, value in data.items()
        if isinstance(value, (int, float, dict))
        and not isinstance(value, bool)
        and key != "sources"
        and value != 0
    ]


@pytest.mark.parametrize("key", sorted(model_profiles()))
def test_every_model_number_has_a_source(key: str) -> None:
    profile = model_profiles()[key]
    missing = [f for f in _numeric_fields(profile) if f not in profile.sources]
    assert missing == [], f"{key}: no source for {missing}"


@pytest.mark.parametrize("key", sorted(gpu_profiles()))
def test_every_gpu_number_has_a_source(key: str) -> None:
    profile = gpu_profiles()[key]
    missing = [
        f for f in (*_numeric_fields(profile), "computeCapability") if f not in profile.sources
    ]
    assert missing == [], f"{key}: no source for {missing}"


def test_required_profiles_exist() -> None:
    assert {"deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v3.2"} <= set(model_profiles())
    products = set(gpu_profiles())
    assert {
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-H200",
        "NVIDIA-B200",
        "NVIDIA-GB200",
        "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
    } <= products


@pytest.mark.parametrize("key", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_v4_layer_layout_adds_up(key: str) -> None:
    v4 = model_profiles()[key]
    assert v4.swa_only_layers + v4.c4_layers + v4.c128_layers == v4.layers


def test_v4_pro_layers_are_the_published_config_json() -> None:
    # config.json compress_ratios: the conformance tier feeds the same file to each release
    import json

    from tests.support.paths import REPO

    config = json.loads(
        (REPO / "tests/conformance/data/deepseek-v4-pro/config.json").read_text("utf-8")
    )
    pro = model_profiles()["deepseek-v4-pro"]
    ratios = config["compress_ratios"][: config["num_hidden_layers"]]
    assert (
        (len(ratios), ratios.count(0), ratios.count(4), ratios.count(128))
        == (
            pro.layers,
            pro.swa_only_layers,
            pro.c4_layers,
            pro.c128_layers,
        )
        == (61, 0, 30, 31)
    )
    assert config["qk_nope_head_dim"] + config["qk_rope_head_dim"] == 512
    assert pro.non_expert_weights_gib < min(pro.checkpoints.values())


def test_compute_capability_matches_the_architecture() -> None:
    for profile in gpu_profiles().values():
        hopper = profile.compute_capability == "sm90"
        assert hopper == (profile.arch == "hopper"), profile.key

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
    assert {"deepseek-v4-flash", "deepseek-v3.2"} <= set(model_profiles())
    products = set(gpu_profiles())
    assert {
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-H200",
        "NVIDIA-B200",
        "NVIDIA-GB200",
        "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
    } <= products


def test_v4_layer_layout_adds_up() -> None:
    v4 = model_profiles()["deepseek-v4-flash"]
    assert v4.swa_only_layers + v4.c4_layers + v4.c128_layers == v4.layers


def test_compute_capability_matches_the_architecture() -> None:
    for profile in gpu_profiles().values():
        hopper = profile.compute_capability == "sm90"
        assert hopper == (profile.arch == "hopper"), profile.key

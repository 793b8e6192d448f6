"""Model and GPU profiles: data files with a source for every number, loaded into typed records."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field


class _Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    sources: dict[str, str] = Field(description="Where each number comes from.")


class ModelProfile(_Profile):
    """Architecture numbers of one model family member."""

    key: str
    family: Literal["dsv4", "dsa"]
    served_name: str = Field(alias="servedName")
    tool_call_parser: str = Field(alias="toolCallParser")
    reasoning_parser: str = Field(alias="reasoningParser")
    layers: int
    swa_only_layers: int = Field(default=0, alias="swaOnlyLayers")
    c4_layers: int = Field(default=0, alias="c4Layers")
    c128_layers: int = Field(default=0, alias="c128Layers")
    qk_nope_head_dim: int = Field(alias="qkNopeHeadDim")
    qk_rope_head_dim: int = Field(alias="qkRopeHeadDim")
    index_head_dim: int = Field(alias="indexHeadDim")
    kv_lora_rank: int = Field(alias="kvLoraRank")
    swa_window: int = Field(default=0, alias="swaWindow")
    swa_full_tokens_ratio: float = Field(default=0.0, alias="swaFullTokensRatio")
    page_size: int = Field(alias="pageSize")
    state_page_size: int = Field(default=0, alias="statePageSize")
    c4_ring_size: int = Field(default=0, alias="c4RingSize")
    c4_ring_size_speculative: int = Field(default=0, alias="c4RingSizeSpeculative")
    c128_ring_size: int = Field(default=0, alias="c128RingSize")
    c128_ring_size_speculative: int = Field(default=0, alias="c128RingSizeSpeculative")
    mla_fp8_kv_bytes_per_layer: int = Field(default=0, alias="mlaFp8KvBytesPerLayer")
    total_params_b: float = Field(alias="totalParamsB")
    default_checkpoint: str = Field(alias="defaultCheckpoint")
    checkpoints: dict[str, float] = Field(
        description="Weight GiB (all ranks) per checkpoint format."
    )
    non_expert_weights_gib: float = Field(
        default=0.0,
        alias="nonExpertWeightsGiB",
        description="GiB of every weight but the routed experts (attention, shared experts, "
        "embeddings): split over the attention-TP group rather than all TP ranks under DP "
        "attention. 0: not known, all weights are split over the TP ranks.",
    )


class GpuProfile(_Profile):
    """One GPU product."""

    key: str
    name: str
    memory_gib: float = Field(alias="memoryGiB")
    arch: Literal["hopper", "blackwell"]
    compute_capability: str = Field(alias="computeCapability")


def _load(name: str) -> dict[str, dict[str, Any]]:
    text = resources.files("dsv4_operator.engine").joinpath("data", name).read_text("utf-8")
    data: dict[str, dict[str, Any]] = yaml.safe_load(text)
    return data


@cache
def model_profiles() -> dict[str, ModelProfile]:
    """All built-in model profiles by key."""
    return {
        k: ModelProfile.model_validate({"key": k, **v}) for k, v in _load("models.yaml").items()
    }


@cache
def gpu_profiles() -> dict[str, GpuProfile]:
    """All built-in GPU profiles by nvidia.com/gpu.product label."""
    return {k: GpuProfile.model_validate({"key": k, **v}) for k, v in _load("gpus.yaml").items()}

"""The one engine configuration both roles share (`spec.engine`) and the image's capabilities."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from dsv4_operator.api.base import ApiModel
from dsv4_operator.api.kube_types import ENV_NAME_PATTERN
from dsv4_operator.api.limits import (
    MAX_ARG_LENGTH,
    MAX_CONTEXT_TOKENS,
    MAX_LIST_ITEMS,
    MAX_VALUE_LENGTH,
)

IndexKDtype = Literal["fp8", "bf16", "fp4"]
# DSV4 accepts only fp8_e4m3 and bfloat16; V3.2 also fp8_e5m2 (docs/engine-notes.md#kv-cache-dtype).
KvCacheDtype = Literal["fp8_e4m3", "fp8_e5m2", "bfloat16"]


class Capability(StrEnum):
    """What a patched engine image declares it has (image label `dsv4.io/capabilities`)."""

    BF16_INDEX_K = "bf16IndexK"
    """Honours SGLANG_DSV4_BF16_INDEX_K=1 (bf16 index-K pool, 256 B/token/C4 layer)."""
    INDEX_K_HICACHE_GATE = "indexKHiCacheGate"
    """Every index-K getter waits for the HiCache layer transfer (sglang PR #22811 class)."""
    POOL_SIZING_FIX = "poolSizingFix"
    """The pool configurator sizes index-K with the real dtype (docs/engine-notes.md)."""
    MULTI_STREAM_INDEX_K_FIX = "multiStreamIndexKFix"
    """The alt-stream indexer does not alias bf16 transients in the CUDA-graph pool."""
    TOOL_CALL_DROP_COUNTER = "toolCallDropCounter"
    """The DeepSeek tool-call parsers count the responses they parse and the calls they drop
    (`sglang:dsv4_tool_call_responses_total`, `sglang:dsv4_tool_call_drops_total{reason}`;
    docs/engine-notes.md#leak-shapes)."""


class EnvVar(ApiModel):
    """A literal environment variable passed to the engine container."""

    name: str = Field(
        min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name."
    )
    value: str = Field(default="", max_length=MAX_VALUE_LENGTH, description="Literal value.")


class HiCacheSpec(ApiModel):
    """Hierarchical (host memory) KV cache, sglang --enable-hierarchical-cache."""

    enabled: bool = Field(default=False, description="Enable HiCache.")
    ratio: float = Field(
        default=2.0,
        gt=1.0,
        le=100.0,
        description="Host pool size as a ratio of the device pool (--hicache-ratio).",
    )
    size_gb: int = Field(
        default=0,
        alias="sizeGB",
        ge=0,
        le=1 << 16,
        description="Host pool size in GB; overrides ratio when > 0 (--hicache-size).",
    )
    write_policy: Literal["write_back", "write_through", "write_through_selective"] = Field(
        default="write_through", description="--hicache-write-policy."
    )


class OverlapSpec(ApiModel):
    """Overlap switches that interact with correctness."""

    scheduler: bool = Field(
        default=False,
        description="CPU scheduler / GPU overlap; false renders --disable-overlap-schedule "
        "(PD decode deadlocks: sglang #27938, #28039, #32209).",
    )
    multi_stream: bool = Field(
        default=False,
        description="DSV4 alt-stream overlap, rendered as SGLANG_OPT_USE_MULTI_STREAM_OVERLAP "
        "(upstream default on; unsafe with bf16 index-K, DSV4-R002).",
    )


class EngineSpec(ApiModel):
    """ONE engine configuration shared by prefill and decode."""

    image: str = Field(
        min_length=1,
        max_length=512,
        description="Engine image (patched SGLang), pinned by tag or digest.",
    )
    sglang_version: str = Field(
        alias="sglangVersion",
        max_length=32,
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$",
        description="The SGLang release the image is built on (its `dsv4.io/sglang-version` "
        "label); selects flag names, env names and pool arithmetic. `dsv4 rules` lists the "
        "supported releases.",
    )
    capabilities: list[Capability] = Field(
        default_factory=list,
        description="What the image declares it has (its `dsv4.io/capabilities` label): "
        "bf16IndexK, indexKHiCacheGate, poolSizingFix, multiStreamIndexKFix, "
        "toolCallDropCounter.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    index_k_dtype: IndexKDtype = Field(
        default="fp8",
        alias="indexKDtype",
        description="Lightning-indexer key dtype: fp8 (132 B/token/C4 layer), "
        "bf16 (256, patched images), fp4 (68, Blackwell).",
    )
    kv_cache_dtype: KvCacheDtype = Field(default="fp8_e4m3", description="--kv-cache-dtype.")
    hicache: HiCacheSpec = Field(default_factory=HiCacheSpec, description="Hierarchical KV cache.")
    overlap: OverlapSpec = Field(default_factory=OverlapSpec, description="Overlap switches.")
    cuda_graph_max_bs: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="--cuda-graph-max-bs; larger decode batches run eager.",
    )
    max_running_requests: int = Field(
        default=64, ge=1, le=1 << 16, description="--max-running-requests."
    )
    mem_fraction_static: float = Field(
        default=0.85, gt=0.0, lt=1.0, description="--mem-fraction-static (weights + KV pool share)."
    )
    context_length: int = Field(
        default=131072, ge=1024, le=MAX_CONTEXT_TOKENS, description="--context-length."
    )
    tool_call_parser: str = Field(
        default="deepseekv4", max_length=64, description="--tool-call-parser."
    )
    reasoning_parser: str = Field(
        default="deepseek-v4", max_length=64, description="--reasoning-parser."
    )
    extra_args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Passthrough sglang arguments for both roles; "
        "flags the operator owns are refused.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Passthrough environment for both roles; names the operator owns are refused.",
    )

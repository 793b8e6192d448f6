"""SGLang's KV pool arithmetic per release: bytes per full token by pool, and the fixed pools.

Pure functions of the model profile, the index-K size and the resolved engine settings. Each
generation mirrors one release's `DSV4PoolConfigurator` (or the DSA path of
`DefaultPoolConfigurator`); tests/conformance calls the release's own configurator on CPU and
asserts the same numbers to the byte. docs/engine-notes.md cites the source lines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsv4_operator.engine.kv_layout import DEFAULT_LAYOUTS, KvLayouts
from dsv4_operator.engine.profiles import ModelProfile
from dsv4_operator.engine.releases import PoolArithmetic

FP8_QUANT_BLOCK = 128  # quant_block_size = 128: one fp32 scale per 128 index-K values
STATE_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2}


@dataclass(frozen=True)
class PoolSettings:
    """The resolved engine settings the arithmetic reads (one role, one rank)."""

    indexer_bytes: int
    state_bytes: int
    speculative: bool
    max_running_requests: int
    mode: str  # "prefill" | "decode"
    decode_extra_slots: int
    # The paged KV layouts (0.5.23's SGLANG_DSV4_KV_LAYOUT & co.); the ratio arithmetic of
    # earlier releases has one layout only and does not read them.
    kv_layouts: KvLayouts = DEFAULT_LAYOUTS


@dataclass(frozen=True)
class PoolSizing:
    """What a release's configurator derives: bytes per full token, fixed pools, the SWA rule.

    `bytes_per_full_token` is computed in the engine's own order of float operations so that
    the token counts match it exactly; `per_token` splits the same bytes by pool for display.
    """

    bytes_per_full_token: float
    per_token: dict[str, float]
    fixed: dict[str, float] = field(default_factory=dict)
    swa_ratio: float = 0.0

    @property
    def fixed_bytes(self) -> float:
        return sum(self.fixed.values())

    def full_tokens(self, available_bytes: float, page_size: int) -> int:
        """`calculate_pool_sizes`: tokens of the full pool for a KV budget, page-aligned."""
        for_tokens = max(available_bytes - self.fixed_bytes, 0)
        return int(for_tokens / self.bytes_per_full_token) // page_size * page_size

    def swa_tokens(self, full_tokens: int, page_size: int) -> int:
        return int(full_tokens * self.swa_ratio) // page_size * page_size


def indexer_bytes_per_token(dtype: str, head_dim: int) -> int:
    """Bytes per token per C4 layer of the lightning-indexer keys."""
    if dtype == "fp8":
        return head_dim + head_dim // FP8_QUANT_BLOCK * 4  # 132 for head_dim 128
    if dtype == "bf16":
        return head_dim * 2  # 256: no scales (the bf16 index-K fork)
    return head_dim // 2 + head_dim // 32  # fp4: 68 (get_dsv4_indexer_bytes_per_token)


def num_req_slots(settings: PoolSettings) -> int:
    """`_get_num_req_slots`: decode adds the in-transfer slots."""
    extra = settings.decode_extra_slots if settings.mode == "decode" else 0
    return settings.max_running_requests + extra + 1


def _c128_state_fixed_bytes(model: ModelProfile, settings: PoolSettings) -> int:
    """`_get_c128_state_fixed_bytes` (offline compression): request-scoped C128 state rows."""
    if model.c128_layers == 0:
        return 0
    ring = model.c128_ring_size_speculative if settings.speculative else model.c128_ring_size
    rows = math.ceil((num_req_slots(settings) * ring + ring + 1) / 128) * 128
    attn_head_dim = model.qk_nope_head_dim + model.qk_rope_head_dim
    return rows * 2 * attn_head_dim * settings.state_bytes * model.c128_layers


def _c4_ring(model: ModelProfile, settings: PoolSettings) -> int:
    return model.c4_ring_size_speculative if settings.speculative else model.c4_ring_size


def _speculative_inflation(model: ModelProfile, settings: PoolSettings) -> float:
    """A draft worker is reserved by inflating per-token bytes by (target + 1) / target."""
    return (model.layers + 1) / model.layers if settings.speculative else 1.0


def dsv4_ratio(model: ModelProfile, settings: PoolSettings) -> PoolSizing:
    """SGLang 0.5.16 `DSV4PoolConfigurator._get_bytes_per_full_token` and its fixed bytes."""
    kv = model.qk_nope_head_dim + model.qk_rope_head_dim * 2 + 8  # 584
    attn_head_dim = model.qk_nope_head_dim + model.qk_rope_head_dim
    swa = model.swa_full_tokens_ratio
    state_ratio = _c4_ring(model, settings) / model.swa_window  # per 128-token SWA page
    c4_state = 2 * 2 * attn_head_dim * settings.state_bytes
    c4_indexer_state = 2 * 2 * model.index_head_dim * settings.state_bytes
    l4, l128 = model.c4_layers, model.c128_layers
    per_token = {
        "swa": swa * kv * model.layers,
        "c4": 1 / 4 * kv * l4,
        "c128": 1 / 128 * kv * l128,
        "indexer": 1 / 4 * settings.indexer_bytes * l4,
        "c4State": swa * state_ratio * c4_state * l4,
        "c4IndexerState": swa * state_ratio * c4_indexer_state * l4,
    }
    total = (
        per_token["swa"] + per_token["c4"] + per_token["c128"] + per_token["indexer"]
        + per_token["c4State"] + 0 * l128 + per_token["c4IndexerState"]
    )  # fmt: skip
    inflation = _speculative_inflation(model, settings)
    if settings.speculative:
        total *= inflation
    return PoolSizing(
        bytes_per_full_token=total,
        per_token={k: v * inflation for k, v in per_token.items()},
        fixed={"c128State": _c128_state_fixed_bytes(model, settings)},
        swa_ratio=swa,
    )


def dsv4_paged(model: ModelProfile, settings: PoolSettings) -> PoolSizing:
    """SGLang 0.5.23 `DSV4PoolConfigurator` (any KV layout, no HiSparse, no encoder replay).

    Rows are page-padded per pool in the layout the settings select (engine/kv_layout.py:
    V4 by default, the V4.1 layouts on SM100) and the C4 compress state is priced per storage
    page. The
    SWA pool stays a ratio of the full pool: 0.5.23 also has a request-cap mode, but its DSV4
    override sets the ratio before the cap is considered, so the release never uses it for
    DeepSeek-V4 (docs/engine-notes.md; tests/conformance checks it).
    """
    attn_head_dim = model.qk_nope_head_dim + model.qk_rope_head_dim
    c4_state = 2 * 2 * attn_head_dim * settings.state_bytes
    c4_indexer_state = 2 * 2 * model.index_head_dim * settings.state_bytes
    state_ratio = _c4_ring(model, settings) / model.page_size
    layouts = settings.kv_layouts
    swa_token_bytes = layouts.main.bytes_per_token(model.page_size) * model.layers + (
        state_ratio * (c4_state + c4_indexer_state) * model.c4_layers
    )
    c4_row = layouts.compressed(4).bytes_per_token(model.page_size // 4)
    c4 = 1 / 4 * c4_row + 1 / 4 * settings.indexer_bytes
    c128 = 1 / 128 * layouts.compressed(128).bytes_per_token(model.page_size // 128)
    swa = model.swa_full_tokens_ratio
    total = swa * swa_token_bytes + (c4 * model.c4_layers + c128 * model.c128_layers)
    inflation = _speculative_inflation(model, settings)
    if settings.speculative:
        total *= inflation
    per_token = {
        "swa": swa * swa_token_bytes,
        "c4": 1 / 4 * c4_row * model.c4_layers,
        "c128": c128 * model.c128_layers,
        "indexer": 1 / 4 * settings.indexer_bytes * model.c4_layers,
    }
    return PoolSizing(
        bytes_per_full_token=total,
        per_token={k: v * inflation for k, v in per_token.items()},
        fixed={"c128State": _c128_state_fixed_bytes(model, settings)},
        swa_ratio=swa,
    )


def dsa(model: ModelProfile, kv_cache_dtype: str, indexer_bytes: int) -> PoolSizing:
    """V3.2 `DefaultPoolConfigurator._compute_cell_size` with the given indexer size."""
    if kv_cache_dtype == "bfloat16":
        kv_layer = float((model.kv_lora_rank + model.qk_rope_head_dim) * 2)
    else:
        kv_layer = float(model.mla_fp8_kv_bytes_per_layer)
    per_token = {"mla": kv_layer * model.layers, "indexer": float(indexer_bytes * model.layers)}
    return PoolSizing(
        bytes_per_full_token=per_token["mla"] + per_token["indexer"], per_token=per_token
    )


def pool_sizing(
    arithmetic: PoolArithmetic, model: ModelProfile, kv_cache_dtype: str, settings: PoolSettings
) -> PoolSizing:
    """The sizing a release's configurator computes for this model and these settings."""
    if model.family == "dsa":
        return dsa(model, kv_cache_dtype, settings.indexer_bytes)
    if arithmetic is PoolArithmetic.PAGED:
        return dsv4_paged(model, settings)
    return dsv4_ratio(model, settings)

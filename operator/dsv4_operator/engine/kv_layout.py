"""DeepSeek-V4 paged KV layouts: which ones a release's settings select, and their bytes per token.

Mirrors SGLang 0.5.23 `kernels/ops/attention/dsv4/kv_layout.py` (`KVLayout`: data and scale
bytes per token, the page stride's alignment) and `mem_cache/deepseek_v4_memory_pool.py`
(`select_dsv4_kv_layout`, `resolve_compressed_kv_layout`): `SGLANG_DSV4_KV_LAYOUT` picks the
main cache's layout, `SGLANG_DSV4_COMPRESSED_KV_LAYOUT` the compressed caches', and
`--dsv4-attn-backend` can force one. tests/conformance compares the resulting pool bytes with
the release's own `DSV4PoolConfigurator`, and the refusals with the release's own asserts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

KV_LAYOUT_ENV = "SGLANG_DSV4_KV_LAYOUT"
COMPRESSED_KV_LAYOUT_ENV = "SGLANG_DSV4_COMPRESSED_KV_LAYOUT"
ATTN_BACKEND_FLAG = "--dsv4-attn-backend"
DEFAULT_KV_LAYOUT = "v4"  # environ.py: SGLANG_DSV4_KV_LAYOUT = EnvStr("v4")
DEFAULT_COMPRESSED_KV_LAYOUT = "auto"
# The V4.1 layouts run only on SM100 / SM103 (`torch.cuda.get_device_capability()[0] == 10`).
V41_ARCHS = frozenset({"sm100", "sm103"})


@dataclass(frozen=True)
class KvLayout:
    """One paged layout: a token's data and scale bytes, the unit its page stride is padded to."""

    name: str
    data_bytes: int
    scale_bytes: int
    page_align: int

    def page_bytes(self, page_tokens: int) -> int:
        raw = page_tokens * (self.data_bytes + self.scale_bytes)
        return -(-raw // self.page_align) * self.page_align

    def bytes_per_token(self, page_tokens: int) -> float:
        """`layout.page_bytes(page) / page`: the pool's bytes per token, page padding included."""
        return self.page_bytes(page_tokens) / page_tokens


V4 = KvLayout("v4", 576, 8, 576)  # 448 fp8 nope + 64 bf16 rope, ue8m0 scales
V41 = KvLayout("v41", 512, 16, 512)
V41_NEW = KvLayout("v41_new", 512, 16, 528)  # the same bytes, scales interleaved per token
V41_FP4 = KvLayout("v41_fp4", 256, 32, 256)
V41_FP4_NEW = KvLayout("v41_fp4_new", 256, 32, 288)
# trtllm's uniform FP8 pools: 512 B rows with no page padding (pool_configurator.py sizes
# them at attn_head_dim and skips the page pad).
UNIFORM_FP8 = KvLayout("uniform_fp8", 512, 0, 1)

_INTERLEAVED = {V41.name: V41_NEW, V41_FP4.name: V41_FP4_NEW}


class LayoutRefused(ValueError):
    """The release refuses these settings at start-up (its own assert, quoted)."""


@dataclass(frozen=True)
class KvLayouts:
    """The main cache's layout and how each compress ratio's cache is laid out beside it."""

    main: KvLayout
    option: str | None = None  # the compressed-cache option: None (auto), "fp8" or "fp4"

    def compressed(self, ratio: int) -> KvLayout:
        """`resolve_compressed_kv_layout`: ratios 1/2 default to fp4, 4 and 128 stay fp8."""
        if self.main in (V4, UNIFORM_FP8):
            return self.main
        use_fp4 = self.option == "fp4" or (self.option is None and ratio in (1, 2))
        encoding = V41_FP4 if use_fp4 else V41
        return _INTERLEAVED[encoding.name] if self.main is V41_NEW else encoding

    def pd_layout(self, ratios: tuple[int, ...]) -> str:
        """What the PD handshake compares (`DeepSeekV4TokenToKVPool.pd_kv_layout`)."""
        if self.main is UNIFORM_FP8:
            return UNIFORM_FP8.name
        compressed = [f"c{r}:{self.compressed(r).name}" for r in sorted(set(ratios) - {0})]
        return ",".join([self.main.name, *compressed])


DEFAULT_LAYOUTS = KvLayouts(V4)


def _option(raw: str) -> str | None:
    if raw not in ("auto", "fp8", "fp4"):
        raise LayoutRefused(f"unknown compressed KV layout {raw!r} (auto, fp8 or fp4)")
    return None if raw == "auto" else raw


def select_layouts(env: Mapping[str, str], attn_backend: str | None, arch: str | None) -> KvLayouts:
    """The layouts 0.5.23 builds for DeepSeek-V4 on CUDA, or LayoutRefused with its reason.

    `arch` is the GPU's compute capability (`sm90`, `sm100`, ...), None when unknown (then
    treated as not SM100: the V4.1 layouts cannot be shown to run).
    """
    mode = env.get(KV_LAYOUT_ENV, DEFAULT_KV_LAYOUT).lower()
    raw_option = env.get(COMPRESSED_KV_LAYOUT_ENV, DEFAULT_COMPRESSED_KV_LAYOUT).lower()
    if attn_backend == "flashmla_mega" and mode != "v41_new":
        mode = "v41"
    if attn_backend == "trtllm":
        if mode not in ("auto", "v4") or raw_option not in ("auto", "fp8"):
            raise LayoutRefused("trtllm uses uniform FP8 pools, not the packed V4.1 KV layouts")
        return KvLayouts(UNIFORM_FP8)
    if mode == "v4":
        option = _option(raw_option)
        if option not in (None, "fp8"):
            raise LayoutRefused("the V4 main cache only pairs with V4 caches")
        return KvLayouts(V4, option)
    if mode not in ("v41", "v41_new", "auto"):
        raise LayoutRefused(f"unknown {KV_LAYOUT_ENV}={mode!r} (v4, v41, v41_new or auto)")
    sm100 = arch in V41_ARCHS
    if mode == "auto" and not sm100:
        return KvLayouts(V4)
    if not sm100:
        raise LayoutRefused("the V4.1 KV cache layouts need an SM100 / SM103 GPU")
    return KvLayouts(V41_NEW if mode == "v41_new" else V41, _option(raw_option))

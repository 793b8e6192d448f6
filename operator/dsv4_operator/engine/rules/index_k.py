"""Index-K dtype rules: what the image, the GPU and the index-K's concurrent readers support."""

from __future__ import annotations

from collections.abc import Iterator

from dsv4_operator.api.engine import Capability
from dsv4_operator.engine.rules.catalogue import NOTES, Hit, RuleContext, rule


@rule(
    "DSV4-R001",
    "bf16 index-K + HiCache without the index-K layer-transfer gate",
    "error",
    reference=f"sglang PR #22811; {NOTES}#hicache-index-k-race",
    reads=("engine.indexKDtype", "engine.hicache.enabled", "engine.capabilities"),
    fixed_by=Capability.INDEX_K_HICACHE_GATE,
)
def bf16_index_k_with_ungated_hicache(ctx: RuleContext) -> Iterator[Hit]:
    if (
        ctx.bf16
        and ctx.spec.engine.hicache.enabled
        and not ctx.has(Capability.INDEX_K_HICACHE_GATE)
    ):
        yield Hit(
            "spec.engine.hicache.enabled",
            "bf16 index-K with HiCache on an image without capability indexKHiCacheGate: the "
            "bf16 index-K read path does not wait for the HiCache layer transfer, and 12-18% of "
            "sessions at 60+ concurrent returned corrupted tool calls (sglang PR #22811 is the "
            f"same race for DSA; {NOTES}#hicache-index-k-race). Disable spec.engine.hicache, use "
            "indexKDtype fp8, or use an image that declares indexKHiCacheGate.",
        )


@rule(
    "DSV4-R002",
    "bf16 index-K + multi-stream overlap",
    "error",
    reference=f"{NOTES}#multi-stream-overlap",
    reads=("engine.indexKDtype", "engine.overlap.multiStream", "engine.capabilities"),
    fixed_by=Capability.MULTI_STREAM_INDEX_K_FIX,
)
def bf16_index_k_with_multi_stream_overlap(ctx: RuleContext) -> Iterator[Hit]:
    if (
        ctx.bf16
        and ctx.spec.engine.overlap.multi_stream
        and not ctx.has(Capability.MULTI_STREAM_INDEX_K_FIX)
    ):
        yield Hit(
            "spec.engine.overlap.multiStream",
            "bf16 index-K with multi-stream overlap (SGLANG_OPT_USE_MULTI_STREAM_OVERLAP): the "
            "alt-stream indexer's bf16 transients alias main-stream tensors in the CUDA-graph "
            f"pool and decode loses coherence under load ({NOTES}#multi-stream-overlap). Set "
            "spec.engine.overlap.multiStream: false, or use an image that declares "
            "multiStreamIndexKFix.",
        )


@rule(
    "DSV4-R003",
    "bf16 index-K on an image without bf16IndexK",
    "error",
    reference=f"{NOTES}#bf16-index-k",
    reads=("engine.indexKDtype", "engine.capabilities"),
    fixed_by=Capability.BF16_INDEX_K,
)
def bf16_index_k_without_fork(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.bf16 and not ctx.has(Capability.BF16_INDEX_K):
        yield Hit(
            "spec.engine.indexKDtype",
            f"indexKDtype bf16 on an image without capability bf16IndexK: SGLang "
            f"{ctx.release.version} has no bf16 index-K switch (SGLANG_DSV4_BF16_INDEX_K exists "
            "only in the patched fork), so the setting would be silently ignored. Use an image "
            "that declares bf16IndexK, or indexKDtype fp8.",
        )


@rule(
    "DSV4-R004",
    "fp4 index-K on a GPU the release has no FP4 indexer for",
    "error",
    reference=f"{NOTES}#fp4-index-k",
    reads=("engine.indexKDtype", "gpu.product"),
)
def fp4_index_k_without_support(ctx: RuleContext) -> Iterator[Hit]:
    gpu, archs = ctx.profiles.gpu, ctx.release.fp4_indexer_archs
    if ctx.spec.engine.index_k_dtype == "fp4" and (
        gpu is None or gpu.compute_capability not in archs
    ):
        what = (
            f"{gpu.name} ({gpu.compute_capability})"
            if gpu
            else f"unknown GPU {ctx.spec.gpu.product!r}"
        )
        yield Hit(
            "spec.engine.indexKDtype",
            f"indexKDtype fp4 on {what}: SGLang {ctx.release.version} runs the FP4 indexer "
            f"(--enable-deepseek-v4-fp4-indexer) only on {', '.join(sorted(archs))} and refuses "
            "to start otherwise. Use indexKDtype fp8.",
        )

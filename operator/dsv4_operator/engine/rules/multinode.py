"""Multi-node rules: what a release refuses or mishandles in a role's parallelism across nodes."""

from __future__ import annotations

from collections.abc import Iterator

from dsv4_operator.engine.effective import EffectiveRole
from dsv4_operator.engine.planner import GIB
from dsv4_operator.engine.rules.catalogue import NOTES, Hit, RuleContext, rule

MULTINODE = "docs/multinode.md"
# Backends whose token exchange spans the whole TP group: the release sets ep_size = tp_size
# whatever --ep-size says (arg_groups/overrides.py `_A2A_EP_SPANNING_BACKENDS`, `_a2a_ep_size`).
EP_SPANNING_A2A = frozenset({"megamoe", "deepep", "mooncake", "nixl", "flashinfer", "mori"})
# Passthrough spellings of what the typed fields render (canonical forms, engine/effective.py).
TYPED_FLAGS = {
    "attentionDataParallel": ("--attn-dp-size", "--dp-size", "--enable-dp-attention"),
    "expertParallel": ("--ep-size",),
    "moeAllToAll": ("--moe-a2a-backend",),
}
MB = 1 << 20


@rule(
    "DSV4-R025",
    "parallel sizes that do not divide the tensor-parallel ranks",
    "error",
    reference=f"{NOTES}#replicas-and-nodes",
    reads=("<role>.tensorParallel", "<role>.attentionDataParallel", "<role>.expertParallel"),
    ack=False,
)
def sizes_do_not_divide(ctx: RuleContext) -> Iterator[Hit]:
    for role, eff in ctx.roles.items():
        tp = eff.tensor_parallel
        # 0.5.16 server_args.py _handle_data_parallelism `assert self.tp_size % self.dp_size
        # == 0`; 0.5.23 arg_groups/parallel_hook.py "tp_size must be divisible by attn_dp_size"
        if tp % eff.attention_dp:
            yield Hit(
                f"spec.{role}.attentionDataParallel",
                f"{role} runs {eff.attention_dp} attention-DP groups over tensorParallel {tp}: "
                f"SGLang {ctx.release.version} refuses to start (tp_size must be divisible by "
                "the attention DP size). Use a divisor of tensorParallel.",
            )
        # distributed/parallel_state.py: moe_tp_size = tp // moe_ep_size // moe_dp_size floors
        # an uneven split, and the MoE groups no longer cover the TP ranks.
        if tp % eff.expert_parallel_size:
            yield Hit(
                f"spec.{role}.expertParallel",
                f"{role} splits the experts over {eff.expert_parallel_size} expert-parallel "
                f"ranks inside tensorParallel {tp}: SGLang floors tp / ep into the MoE "
                "tensor-parallel size and the MoE groups no longer cover the ranks. Use a "
                "divisor of tensorParallel.",
            )


@rule(
    "DSV4-R026",
    "MoE all-to-all backend overrides expertParallel",
    "warning",
    reference=f"{MULTINODE}#deepseek-v4-pro-plans",
    reads=("<role>.expertParallel", "<role>.moeAllToAll", "<role>.tensorParallel"),
)
def a2a_overrides_expert_parallel(ctx: RuleContext) -> Iterator[Hit]:
    for role, eff in ctx.roles.items():
        ep, tp = eff.expert_parallel_size, eff.tensor_parallel
        if eff.moe_a2a_backend in EP_SPANNING_A2A and ep != tp:
            yield Hit(
                f"spec.{role}.expertParallel",
                f"{role} asks for expertParallel {ep} with moeAllToAll {eff.moe_a2a_backend}: "
                f"SGLang {ctx.release.version} sets ep_size = tp_size = {tp} for that backend "
                "(arg_groups/overrides.py _a2a_ep_size), so the experts are not split as the "
                f"spec says. Set expertParallel to {tp}, or moeAllToAll none.",
            )


@rule(
    "DSV4-R027",
    "typed parallelism also set in extraArgs",
    "error",
    reference=f"{NOTES}#owned-flags",
    reads=("<role>.attentionDataParallel", "<role>.expertParallel", "<role>.moeAllToAll"),
    ack=False,
)
def typed_parallelism_in_passthrough(ctx: RuleContext) -> Iterator[Hit]:
    for role, eff in ctx.roles.items():
        typed = {
            "attentionDataParallel": eff.attention_data_parallel,
            "expertParallel": eff.expert_parallel,
            "moeAllToAll": eff.moe_all_to_all,
        }
        for field, value in typed.items():
            clash = [f for f in TYPED_FLAGS[field] if value is not None and f in eff.flags]
            if clash:
                yield Hit(
                    ctx.flag_field(role, clash[0]),
                    f"{role} sets spec.{role}.{field} and {', '.join(clash)} in extraArgs: the "
                    "engine would get both and the last one wins. Remove the extraArgs "
                    f"spelling; spec.{role}.{field} renders it for SGLang {ctx.release.version}.",
                )


def release_decode_reserve_mib(eff: EffectiveRole, gpu_mib: float) -> float:
    """What the release keeps outside --mem-fraction-static for a PD decode server when it
    picks the fraction itself: activations, decode CUDA graphs (DP attention pads them by its
    group count) and DeepEP buffers (0.5.16 server_args.py `_handle_gpu_memory_settings`,
    `reserve_for_graph_mb`, `reserve_for_deepep_a2a_mb`; 0.5.23 arg_groups/memory_hook.py)."""
    max_bs = eff.cuda_graph_max_bs
    draft = eff.int_flag("--speculative-num-draft-tokens")
    reserve = 512 + max(eff.max_running_requests * draft, 2048) * 1.5
    reserve += eff.tensor_parallel * eff.int_flag("--pp-size") / 8 * 1024
    reserve += max_bs * 2
    if eff.attention_dp > 1:
        reserve += max_bs * eff.attention_dp * 3
        if max_bs > 300:
            reserve += max_bs * eff.attention_dp * 1.5
    if gpu_mib > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    if eff.moe_a2a_backend == "deepep":
        reserve += 2 * 1024
    return reserve


@rule(
    "DSV4-R028",
    "memFractionStatic leaves decode less than the release reserves (CUDA-graph capture OOM)",
    "warning",
    reference=f"{MULTINODE}#deepseek-v4-pro-plans",
    reads=(
        "engine.memFractionStatic",
        "decode.overrides.memFractionStatic",
        "decode.attentionDataParallel",
        "decode.moeAllToAll",
        "engine.cudaGraphMaxBs",
        "gpu",
    ),
)
def static_fraction_above_release_reserve(ctx: RuleContext) -> Iterator[Hit]:
    eff = ctx.roles["decode"]
    gpu_mib = ctx.profiles.gpu_memory_gib * GIB / MB
    reserve = release_decode_reserve_mib(eff, gpu_mib)
    release_fraction = round((gpu_mib - reserve) / gpu_mib, 3)
    if eff.mem_fraction_static > release_fraction:
        yield Hit(
            "spec.engine.memFractionStatic",
            f"decode memFractionStatic {eff.mem_fraction_static:g} leaves "
            f"{(1 - eff.mem_fraction_static) * gpu_mib / 1024:.1f} GiB of the GPU outside the "
            f"weights and KV pool, less than the {reserve / 1024:.1f} GiB SGLang "
            f"{ctx.release.version} itself reserves for activations, decode CUDA graphs"
            f"{' under DP attention' if eff.attention_dp > 1 else ''}"
            f"{' and DeepEP buffers' if eff.moe_a2a_backend == 'deepep' else ''}: CUDA-graph "
            "capture can run out of memory before the server is ready (sglang #23769, "
            f"DeepSeek-V4-Pro on H200). Use memFractionStatic {release_fraction:g} or lower.",
        )

"""Memory rules: GPUs per replica, the memory plan, workload capacity and pool arithmetic."""

from __future__ import annotations

from collections.abc import Iterator

from dsv4_operator.api.engine import Capability
from dsv4_operator.api.limits import MAX_NODES_PER_REPLICA
from dsv4_operator.engine.effective import gpus_needed
from dsv4_operator.engine.kv_layout import (
    ATTN_BACKEND_FLAG,
    COMPRESSED_KV_LAYOUT_ENV,
    KV_LAYOUT_ENV,
    LayoutRefused,
)
from dsv4_operator.engine.planner import GIB, select_role_layouts
from dsv4_operator.engine.releases import SourceLine
from dsv4_operator.engine.rules.catalogue import NOTES, Change, Hit, RuleContext, rule
from dsv4_operator.engine.topology import topology_of


@rule(
    "DSV4-R007",
    "GPUs requested differ from what the parallelism needs",
    "error",
    reference=f"{NOTES}#replicas-and-nodes",
    reads=(
        "<role>.tensorParallel",
        "<role>.attentionDataParallel",
        "<role>.resources",
        "gpu.perNode",
        "extraArgs --dp-size/--pp-size/--enable-dp-attention",
    ),
    ack=False,
)
def gpus_differ_from_parallelism(ctx: RuleContext) -> Iterator[Hit]:
    per_node = ctx.spec.gpu.per_node
    for role, eff in ctx.roles.items():
        needed = gpus_needed(eff)
        topology = topology_of(eff, per_node)
        if not topology.spans_whole_nodes:
            yield Hit(
                f"spec.{role}.tensorParallel",
                f"{role} needs {needed} GPUs per replica, more than a node has ({per_node}, "
                "spec.gpu.perNode) and not a multiple of it: sglang runs the same number of "
                f"ranks on every node of a replica. Use {per_node * (needed // per_node)} or "
                f"{per_node * topology.nodes} GPUs (tensorParallel x pp x dp), or fit one node.",
            )
        elif topology.multi_node and needed > eff.tensor_parallel * eff.int_flag("--pp-size"):
            # sglang server_args.py check_server_args: "multi-node data parallel is not
            # supported unless dp attention!"
            yield Hit(
                f"spec.{role}.tensorParallel",
                f"{role} needs {needed} GPUs per replica for data parallelism without DP "
                f"attention, more than a node has ({per_node}, spec.gpu.perNode): sglang refuses "
                "multi-node data parallelism unless DP attention runs. Use "
                f"spec.{role}.attentionDataParallel, or more replicas instead of --dp-size.",
            )
        elif topology.nodes > MAX_NODES_PER_REPLICA:
            yield Hit(
                f"spec.{role}.tensorParallel",
                f"{role} needs {topology.nodes} nodes per replica ({needed} GPUs over "
                f"{per_node} per node); the operator supports at most {MAX_NODES_PER_REPLICA}. "
                "Lower the parallelism.",
            )
        resources = ctx.spec.role(role).resources
        for kind, amounts in (("limits", resources.limits), ("requests", resources.requests)):
            asked = amounts.get("nvidia.com/gpu")
            if asked is not None and str(asked) != str(needed):
                yield Hit(
                    f"spec.{role}.resources.{kind}",
                    f"{role} asks for nvidia.com/gpu {asked} but its parallelism needs {needed}; "
                    "remove nvidia.com/gpu from resources (the operator requests what the "
                    "parallelism needs).",
                )


@rule(
    "DSV4-R008",
    "memory plan does not fit",
    "error",
    reference=f"{NOTES}#pool-arithmetic",
    reads=("model", "gpu", "<role>.tensorParallel", "engine.memFractionStatic"),
    ack=False,
)
def plan_does_not_fit(ctx: RuleContext) -> Iterator[Hit]:
    for role, plan in ctx.plan.roles.items():
        if not plan.fits:
            yield Hit(
                f"spec.{role}.tensorParallel",
                f"{role} does not fit: {plan.weights_bytes / GIB:.1f} GiB weights per rank + "
                f"{plan.reserve_bytes / GIB:.1f} GiB reserve exceed memFractionStatic x GPU = "
                f"{plan.static_budget_bytes / GIB:.1f} GiB, leaving no KV pool. Raise "
                "tensorParallel, use a smaller checkpoint or a larger GPU.",
            )


@rule(
    "DSV4-R009",
    "workload needs more KV tokens than the plan provides",
    "warning",
    reference=f"{NOTES}#capacity",
    reads=("workload", "decode.replicas", "engine"),
)
def workload_exceeds_capacity(ctx: RuleContext) -> Iterator[Hit]:
    plan = ctx.plan.roles["decode"]
    wanted = ctx.spec.workload.concurrent_sessions
    if plan.fits and plan.sessions_capacity < wanted:
        dp = plan.attention_data_parallel
        groups = f" x {dp} attention-DP groups" if dp > 1 else ""
        yield Hit(
            "spec.workload.concurrentSessions",
            f"decode holds {plan.sessions_capacity} sessions of "
            f"{ctx.spec.workload.context_tokens} tokens ({plan.max_total_tokens} tokens per "
            f"rank x {plan.replicas} replicas{groups}) but the workload wants {wanted}: expect "
            "retraction churn (sglang:num_retracted_requests_total). Add decode replicas or "
            "lower contextTokens.",
        )


@rule(
    "DSV4-R010",
    "non-fp8 index-K on an image without poolSizingFix",
    "warning",
    reference=f"{NOTES}#pool-sizing-fix",
    reads=("engine.indexKDtype", "engine.capabilities"),
    fixed_by=Capability.POOL_SIZING_FIX,
)
def index_k_sized_as_fp8(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.has(Capability.POOL_SIZING_FIX):
        return
    worst = max(p.unpatched_overcommit_bytes for p in ctx.plan.roles.values())
    if worst > 0:
        plan = ctx.plan.roles["decode"]
        yield Hit(
            "spec.engine.indexKDtype",
            f"indexKDtype {ctx.spec.engine.index_k_dtype} on an image without poolSizingFix: "
            f"SGLang {ctx.release.version}'s configurator sizes index-K at 132 B/token and "
            f"under-reserves {plan.bytes_per_full_token - plan.engine_bytes_per_full_token:.0f} "
            f"B per full token, {worst / 1e9:.2f} GB per rank. The operator pins "
            f"--max-total-tokens to {plan.max_total_tokens} to compensate.",
        )


# Passthrough settings that change the pool arithmetic in ways the planner does not model.
_UNMODELLED_FLAGS = {
    "--enable-hisparse": "HiSparse shrinks the device C4 pool",
    "--enable-encoder-swa-bounded-replay": "encoder replay moves the SWA pool into request windows",
}
_UNMODELLED_ENV = {"SGLANG_OPT_USE_ONLINE_COMPRESS": ""}


@rule(
    "DSV4-R020",
    "passthrough changes the pool arithmetic the planner does not model",
    "error",
    reference=f"{NOTES}#pool-arithmetic",
    reads=("engine.extraArgs", "engine.env", "<role>.overrides"),
)
def pool_arithmetic_not_modelled(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.profiles.model.family != "dsv4":
        return
    for role, eff in ctx.roles.items():
        for flag, why in _UNMODELLED_FLAGS.items():
            if flag in eff.flags:
                yield Hit(
                    ctx.flag_field(role, flag),
                    f"{flag} on {role}: {why}, which the operator's memory plan does not model, "
                    "so the pinned --max-total-tokens would be wrong. Remove it, or acknowledge "
                    "this rule and check the engine's `DSV4 pool sizes` log line yourself.",
                )
        for name, default in _UNMODELLED_ENV.items():
            value = eff.env_map.get(name)
            if value is not None and value.strip().lower() not in (default, "", "0", "false"):
                yield Hit(
                    ctx.env_field(role, name),
                    f"{name}={value} on {role} changes the KV pool layout or state sizing, which "
                    "the operator's memory plan does not model. Remove it, or acknowledge this "
                    "rule and check the engine's `DSV4 pool sizes` log line yourself.",
                )


@rule(
    "DSV4-R024",
    "KV layout the release or the GPU refuses",
    "error",
    reference=f"{NOTES}#kv-layouts",
    reads=("engine.env", "<role>.overrides.env", "extraArgs --dsv4-attn-backend", "gpu.product"),
    ack=False,
    introduced_in=Change(
        "0.5.23",
        proof=SourceLine(
            "srt/mem_cache/deepseek_v4_memory_pool.py",
            "the V4.1 KV cache layouts need an SM100 / SM103 GPU",
        ),
    ),
)
def kv_layout_refused(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.profiles.model.family != "dsv4":
        return
    reported: set[tuple[str, str]] = set()
    for role, eff in ctx.roles.items():
        try:
            select_role_layouts(eff, ctx.profiles)
        except LayoutRefused as refusal:
            names = [n for n in (KV_LAYOUT_ENV, COMPRESSED_KV_LAYOUT_ENV) if n in eff.env_map]
            field = (
                ctx.env_field(role, names[0]) if names else ctx.flag_field(role, ATTN_BACKEND_FLAG)
            )
            if (field, str(refusal)) in reported:
                continue  # set engine-wide: one finding for both roles
            reported.add((field, str(refusal)))
            whose = f"{role}'s" if ".overrides." in field else "the"
            gpu = ctx.profiles.gpu
            on = f"{gpu.name} ({gpu.compute_capability})" if gpu else repr(ctx.spec.gpu.product)
            yield Hit(
                field,
                f"{whose} KV layout settings on {on}: SGLang {ctx.release.version} refuses to "
                f'start ("{refusal}"). Use the default layout (unset {KV_LAYOUT_ENV} and '
                f"{COMPRESSED_KV_LAYOUT_ENV}), or the V4.1 layouts on an SM100 GPU.",
            )

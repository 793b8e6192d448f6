"""The rule catalogue: each rule is a pure check on the spec (and its plan) with a stable id."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dsv4_operator.api.spec import ROLES, Capability, DSV4DeploymentSpec, Role
from dsv4_operator.api.status import Severity
from dsv4_operator.engine.effective import EffectiveRole, effective_role, gpus_needed, parse_args
from dsv4_operator.engine.ownership import (
    OWNED_ENV,
    OWNED_FLAGS,
    TRANSFER_FORMAT_ENV,
    TRANSFER_FORMAT_FLAGS,
)
from dsv4_operator.engine.planner import GIB, Plan, Profiles


@dataclass(frozen=True)
class Hit:
    """A rule's condition holds: where, and what to tell the user."""

    field: str
    message: str


@dataclass(frozen=True)
class RuleContext:
    """Facts every check reads; built once per validation."""

    spec: DSV4DeploymentSpec
    profiles: Profiles
    plan: Plan
    roles: dict[Role, EffectiveRole]

    @property
    def bf16(self) -> bool:
        return self.spec.engine.index_k_dtype == "bf16"

    def has(self, capability: Capability) -> bool:
        return capability in self.spec.engine.capabilities


Check = Callable[[RuleContext], Iterator[Hit]]


@dataclass(frozen=True)
class Rule:
    """One catalogue entry."""

    id: str
    title: str
    severity: Severity
    acknowledgeable: bool
    reference: str
    fixed_by: Capability | None
    reads: tuple[str, ...]
    check: Check

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "title": self.title,
            "severity": self.severity,
            "acknowledgeable": self.acknowledgeable,
            "reference": self.reference,
            "fixedBy": self.fixed_by.value if self.fixed_by else None,
            "reads": list(self.reads),
        }


def _r001(ctx: RuleContext) -> Iterator[Hit]:
    if (
        ctx.bf16
        and ctx.spec.engine.hicache.enabled
        and not ctx.has(Capability.INDEX_K_HICACHE_GATE)
    ):
        yield Hit(
            "spec.engine.hicache.enabled",
            "bf16 index-K with HiCache on an image without capability indexKHiCacheGate: the "
            "index-K read path does not wait for the HiCache layer transfer, and 12-18% of "
            "sessions at 60+ concurrent returned corrupted tool calls (seeds; sglang PR #22811). "
            "Disable spec.engine.hicache, use indexKDtype fp8, or use an image that declares "
            "indexKHiCacheGate.",
        )


def _r002(ctx: RuleContext) -> Iterator[Hit]:
    if (
        ctx.bf16
        and ctx.spec.engine.overlap.multi_stream
        and not ctx.has(Capability.MULTI_STREAM_INDEX_K_FIX)
    ):
        yield Hit(
            "spec.engine.overlap.multiStream",
            "bf16 index-K with multi-stream overlap (SGLANG_OPT_USE_MULTI_STREAM_OVERLAP): the "
            "alt-stream indexer's bf16 transients alias main-stream tensors in the CUDA-graph "
            "pool and decode 'loses the plot' under load (seed 003). Set "
            "spec.engine.overlap.multiStream: false, or use an image that declares "
            "multiStreamIndexKFix.",
        )


def _r003(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.bf16 and not ctx.has(Capability.BF16_INDEX_K):
        yield Hit(
            "spec.engine.indexKDtype",
            "indexKDtype bf16 on an image without capability bf16IndexK: upstream SGLang has no "
            "bf16 index-K switch (SGLANG_DSV4_BF16_INDEX_K exists only in the patched fork), so "
            "the setting would be silently ignored. Use an image that declares bf16IndexK, or "
            "indexKDtype fp8.",
        )


def _r004(ctx: RuleContext) -> Iterator[Hit]:
    gpu = ctx.profiles.gpu
    if ctx.spec.engine.index_k_dtype == "fp4" and (gpu is None or not gpu.fp4_indexer):
        what = f"{gpu.name} ({gpu.arch})" if gpu else f"unknown GPU {ctx.spec.gpu.product!r}"
        yield Hit(
            "spec.engine.indexKDtype",
            f"indexKDtype fp4 on {what}, which has no FP4 indexer support "
            "(--enable-deepseek-v4-fp4-indexer needs Blackwell). Use indexKDtype fp8.",
        )


def _r005(ctx: RuleContext) -> Iterator[Hit]:
    for role, eff in ctx.roles.items():
        if eff.overlap_scheduler:
            overlap = ctx.spec.role(role).overrides.overlap
            field = (
                f"spec.{role}.overrides.overlap.scheduler"
                if overlap is not None and overlap.scheduler is not None
                else "spec.engine.overlap.scheduler"
            )
            yield Hit(
                field,
                f"overlap scheduler on for {role} with PD disaggregation: PD decode with overlap "
                "has deadlocked (watchdog kill) with DP attention and speculative decoding "
                "(sglang #27938, #28039, #32209). Keep overlap.scheduler false unless you have "
                "load-tested this combination.",
            )


def _r006(ctx: RuleContext) -> Iterator[Hit]:
    eff = ctx.roles["decode"]  # prefill never captures CUDA graphs (reference 1.1)
    if eff.max_running_requests > eff.cuda_graph_max_bs:
        yield Hit(
            "spec.engine.maxRunningRequests",
            f"decode maxRunningRequests {eff.max_running_requests} > cudaGraphMaxBs "
            f"{eff.cuda_graph_max_bs}: batches above the captured size run the slow eager "
            'path (sglang:cuda_graph_passes_total{mode="decode_none"}). Raise cudaGraphMaxBs '
            "or lower maxRunningRequests.",
        )


def _r007(ctx: RuleContext) -> Iterator[Hit]:
    per_node = ctx.spec.gpu.per_node
    for role, eff in ctx.roles.items():
        needed = gpus_needed(eff)
        if needed > per_node:
            yield Hit(
                f"spec.{role}.tensorParallel",
                f"{role} needs {needed} GPUs per replica but a node has {per_node} "
                "(spec.gpu.perNode); a replica cannot span nodes. Lower the parallelism.",
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


def _r008(ctx: RuleContext) -> Iterator[Hit]:
    for role, plan in ctx.plan.roles.items():
        if not plan.fits:
            yield Hit(
                f"spec.{role}.tensorParallel",
                f"{role} does not fit: {plan.weights_bytes / GIB:.1f} GiB weights per rank + "
                f"{plan.reserve_bytes / GIB:.1f} GiB reserve exceed memFractionStatic x GPU = "
                f"{plan.static_budget_bytes / GIB:.1f} GiB, leaving no KV pool. Raise "
                "tensorParallel, use a smaller checkpoint or a larger GPU.",
            )


def _r009(ctx: RuleContext) -> Iterator[Hit]:
    plan = ctx.plan.roles["decode"]
    wanted = ctx.spec.workload.concurrent_sessions
    if plan.fits and plan.sessions_capacity < wanted:
        yield Hit(
            "spec.workload.concurrentSessions",
            f"decode holds {plan.sessions_capacity} sessions of "
            f"{ctx.spec.workload.context_tokens} tokens ({plan.max_total_tokens} tokens per "
            f"rank x {plan.replicas} replicas) but the workload wants {wanted}: expect "
            "retraction churn (sglang:num_retracted_requests_total). Add decode replicas or "
            "lower contextTokens.",
        )


def _r010(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.has(Capability.POOL_SIZING_FIX):
        return
    worst = max(p.unpatched_overcommit_bytes for p in ctx.plan.roles.values())
    if worst > 0:
        plan = ctx.plan.roles["decode"]
        yield Hit(
            "spec.engine.indexKDtype",
            f"indexKDtype {ctx.spec.engine.index_k_dtype} on an image without poolSizingFix: "
            f"the engine's configurator sizes index-K at 132 B/token and under-reserves "
            f"{plan.bytes_per_full_token - plan.engine_bytes_per_full_token:.0f} B per full "
            f"token, {worst / 1e9:.2f} GB per rank (seeds: ~1.1 GB/rank). The operator pins "
            f"--max-total-tokens to {plan.max_total_tokens} to compensate.",
        )


def _flag_state(flags: dict[str, tuple[int, str | None]], flag: str) -> str:
    if flag not in flags:
        return "unset"
    value = flags[flag][1]
    return "set" if value is None else value


def _r011(ctx: RuleContext) -> Iterator[Hit]:
    pre, dec = ctx.roles["prefill"], ctx.roles["decode"]
    pre_flags, dec_flags = pre.flags, dec.flags
    for flag in sorted(TRANSFER_FORMAT_FLAGS):
        a, b = _flag_state(pre_flags, flag), _flag_state(dec_flags, flag)
        if a != b:
            yield Hit(
                "spec.decode.overrides.extraArgs"
                if flag in parse_args(dec.role_extra_args)
                else "spec.prefill.overrides.extraArgs",
                f"{flag} differs between prefill ({a}) and decode ({b}): it changes the P/D "
                "transfer format, and the handshake only compares kv_cache_dtype, so decode "
                "would read garbage. Set it once in spec.engine.extraArgs.",
            )
    pre_env, dec_env = pre.env_map, dec.env_map
    for name in sorted(TRANSFER_FORMAT_ENV):
        if pre_env.get(name) != dec_env.get(name):
            yield Hit(
                "spec.decode.overrides.env"
                if any(e.name == name for e in ctx.spec.decode.overrides.env)
                else "spec.prefill.overrides.env",
                f"{name} differs between prefill ({pre_env.get(name, 'unset')}) and decode "
                f"({dec_env.get(name, 'unset')}): it changes the P/D transfer format. Set it "
                "once in spec.engine.env.",
            )


def _r012(ctx: RuleContext) -> Iterator[Hit]:
    for role, eff in ctx.roles.items():
        backend = eff.flags.get("--dsv4-attn-backend")
        if backend is not None and backend[1] == "trtllm":
            yield Hit(
                "spec.engine.extraArgs",
                f"--dsv4-attn-backend trtllm on {role}: its uniform-FP8 512 B layout is not in "
                "the PD handshake and the engine asserts disaggregation_mode == null "
                "(sglang #37838). Remove it.",
            )
        if eff.env_map.get("SGLANG_DSV4_UNIFIED_KV_FP8", "0") not in ("", "0", "false", "False"):
            yield Hit(
                "spec.engine.env",
                f"SGLANG_DSV4_UNIFIED_KV_FP8 on {role}: the unified layout drops the rope pool in "
                "PD transfer and the engine refuses PD with it (reference 1.1). Remove it.",
            )


def _r013(ctx: RuleContext) -> Iterator[Hit]:
    sources: list[tuple[str, tuple[str, ...], list[str]]] = [
        ("spec.engine", tuple(ctx.spec.engine.extra_args), [e.name for e in ctx.spec.engine.env])
    ]
    for role in ROLES:
        o = ctx.spec.role(role).overrides
        sources.append((f"spec.{role}.overrides", tuple(o.extra_args), [e.name for e in o.env]))
    for prefix, args, env_names in sources:
        for flag in parse_args(args):
            if flag in OWNED_FLAGS:
                yield Hit(
                    f"{prefix}.extraArgs",
                    f"{flag} is owned by the operator; use {OWNED_FLAGS[flag]} instead.",
                )
        for name in env_names:
            if name in OWNED_ENV:
                yield Hit(
                    f"{prefix}.env",
                    f"{name} is owned by the operator; use {OWNED_ENV[name]} instead.",
                )


def _r014(ctx: RuleContext) -> Iterator[Hit]:
    model, engine = ctx.profiles.model, ctx.spec.engine
    if engine.tool_call_parser != model.tool_call_parser:
        yield Hit(
            "spec.engine.toolCallParser",
            f"toolCallParser {engine.tool_call_parser!r} does not match {model.key}, whose DSML "
            f"tool calls need {model.tool_call_parser!r}: calls come back as content with no "
            "tool_calls (sglang #17593, #40236).",
        )
    if engine.reasoning_parser != model.reasoning_parser:
        yield Hit(
            "spec.engine.reasoningParser",
            f"reasoningParser {engine.reasoning_parser!r} does not match {model.key}, which needs "
            f"{model.reasoning_parser!r} (reference 2.4).",
        )


def _r015(ctx: RuleContext) -> Iterator[Hit]:
    for role, eff in ctx.roles.items():
        if ctx.profiles.model.family == "dsv4" and "--chat-template" in eff.flags:
            yield Hit(
                "spec.engine.extraArgs",
                f"--chat-template on {role} for DeepSeek-V4: the model's own template emits the "
                "DSML the parser expects; a custom one has produced content-only tool calls "
                "(sglang #17593, reference 7 item 7). Remove it unless it is DSML-exact.",
            )
            return


def _r016(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.profiles.model.family == "dsv4" and ctx.spec.engine.kv_cache_dtype != "fp8_e4m3":
        yield Hit(
            "spec.engine.kvCacheDtype",
            f"kvCacheDtype {ctx.spec.engine.kv_cache_dtype} with DeepSeek-V4: on CUDA the DSV4 "
            "pool stores fp8_e4m3 (584 B/token, reference 2.3); fp8_e5m2 is refused and "
            "bfloat16 is the NPU layout (bf16 KV on CUDA is the unmerged PR #33413). Use fp8_e4m3.",
        )


def _r017(ctx: RuleContext) -> Iterator[Hit]:
    if (
        ctx.profiles.model.family == "dsv4"
        and ctx.spec.engine.hicache.enabled
        and any(eff.speculative for eff in ctx.roles.values())
    ):
        yield Hit(
            "spec.engine.hicache.enabled",
            "HiCache with speculative decoding on DeepSeek-V4: the pool can report evictable "
            "tokens that never evict, ending in a scheduler watchdog kill (sglang #30532). "
            "Load-test before relying on it.",
        )


def _rule(
    id: str,
    title: str,
    severity: Severity,
    check: Check,
    reference: str,
    reads: tuple[str, ...],
    *,
    ack: bool = True,
    fixed_by: Capability | None = None,
) -> Rule:
    return Rule(id, title, severity, ack, reference, fixed_by, reads, check)


CATALOGUE: tuple[Rule, ...] = (
    _rule(
        "DSV4-R001",
        "bf16 index-K + HiCache without the index-K layer-transfer gate",
        "error",
        _r001,
        "seeds 000/003/004; sglang PR #22811",
        ("engine.indexKDtype", "engine.hicache.enabled", "engine.capabilities"),
        fixed_by=Capability.INDEX_K_HICACHE_GATE,
    ),
    _rule(
        "DSV4-R002",
        "bf16 index-K + multi-stream overlap",
        "error",
        _r002,
        "seed 003",
        ("engine.indexKDtype", "engine.overlap.multiStream", "engine.capabilities"),
        fixed_by=Capability.MULTI_STREAM_INDEX_K_FIX,
    ),
    _rule(
        "DSV4-R003",
        "bf16 index-K on an image without bf16IndexK",
        "error",
        _r003,
        "seeds 000/004; reference 0 (SGLANG_DSV4_BF16_INDEX_K not upstream)",
        ("engine.indexKDtype", "engine.capabilities"),
        fixed_by=Capability.BF16_INDEX_K,
    ),
    _rule(
        "DSV4-R004",
        "fp4 index-K on a GPU without FP4 indexer support",
        "error",
        _r004,
        "reference 2.3 (--enable-deepseek-v4-fp4-indexer)",
        ("engine.indexKDtype", "gpu.product"),
    ),
    _rule(
        "DSV4-R005",
        "overlap scheduler with PD disaggregation",
        "warning",
        _r005,
        "sglang #27938, #28039, #32209",
        ("engine.overlap.scheduler", "<role>.overrides.overlap"),
    ),
    _rule(
        "DSV4-R006",
        "maxRunningRequests above cudaGraphMaxBs (eager fallback)",
        "warning",
        _r006,
        "reference 2.2; seeds (eager decode path)",
        ("engine.maxRunningRequests", "engine.cudaGraphMaxBs", "decode.overrides"),
    ),
    _rule(
        "DSV4-R007",
        "GPUs requested differ from what the parallelism needs",
        "error",
        _r007,
        "DESIGN.md section 3",
        (
            "<role>.tensorParallel",
            "<role>.resources",
            "gpu.perNode",
            "extraArgs --dp-size/--pp-size/--enable-dp-attention",
        ),
        ack=False,
    ),
    _rule(
        "DSV4-R008",
        "memory plan does not fit",
        "error",
        _r008,
        "reference 3.4; seeds 000",
        ("model", "gpu", "<role>.tensorParallel", "engine.memFractionStatic"),
        ack=False,
    ),
    _rule(
        "DSV4-R009",
        "workload needs more KV tokens than the plan provides",
        "warning",
        _r009,
        "reference 4.4 (retraction); seeds 004 (capacity pressure)",
        ("workload", "decode.replicas", "engine"),
    ),
    _rule(
        "DSV4-R010",
        "non-fp8 index-K on an image without poolSizingFix",
        "warning",
        _r010,
        "seeds 000/001; reference 3.4",
        ("engine.indexKDtype", "engine.capabilities"),
        fixed_by=Capability.POOL_SIZING_FIX,
    ),
    _rule(
        "DSV4-R011",
        "transfer-format setting differs between roles",
        "error",
        _r011,
        "seed 004; reference 1.1 (handshake compares only kv_cache_dtype)",
        ("<role>.overrides.extraArgs", "<role>.overrides.env"),
        ack=False,
    ),
    _rule(
        "DSV4-R012",
        "trtllm DSV4 attention or unified FP8 KV with PD",
        "error",
        _r012,
        "sglang #37838; reference 1.1",
        ("engine.extraArgs", "engine.env"),
        ack=False,
    ),
    _rule(
        "DSV4-R013",
        "passthrough sets a flag or env var the operator owns",
        "error",
        _r013,
        "DESIGN.md section 3 (Flags)",
        ("engine.extraArgs", "engine.env", "<role>.overrides"),
        ack=False,
    ),
    _rule(
        "DSV4-R014",
        "tool-call or reasoning parser does not match the model",
        "error",
        _r014,
        "sglang #17593, #40236; reference 2.4",
        ("engine.toolCallParser", "engine.reasoningParser", "model.profile"),
    ),
    _rule(
        "DSV4-R015",
        "custom chat template on DeepSeek-V4",
        "warning",
        _r015,
        "sglang #17593; reference 7 item 7",
        ("engine.extraArgs",),
    ),
    _rule(
        "DSV4-R016",
        "KV cache dtype the DSV4 CUDA pool does not store",
        "error",
        _r016,
        "reference 2.3 (--kv-cache-dtype); PR #33413",
        ("engine.kvCacheDtype", "model.profile"),
    ),
    _rule(
        "DSV4-R017",
        "HiCache with speculative decoding on DeepSeek-V4",
        "warning",
        _r017,
        "sglang #30532",
        ("engine.hicache.enabled", "extraArgs --speculative-algorithm"),
    ),
)

RULES_BY_ID: dict[str, Rule] = {rule.id: rule for rule in CATALOGUE}


def context(spec: DSV4DeploymentSpec, profiles: Profiles, plan: Plan) -> RuleContext:
    return RuleContext(
        spec=spec,
        profiles=profiles,
        plan=plan,
        roles={role: effective_role(spec, role) for role in ROLES},
    )


def run_rules(ctx: RuleContext) -> list[tuple[Rule, Hit]]:
    """Every (rule, hit) whose condition holds, in catalogue order."""
    return [(rule, hit) for rule in CATALOGUE for hit in rule.check(ctx)]

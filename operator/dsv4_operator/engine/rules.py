"""The rule catalogue: each rule is a pure check on the spec and its plan, registered with its
metadata (id, severity, the releases it applies to, its public source) right above the check.

Sources cite sglang issue/PR numbers and docs/engine-notes.md sections, which hold the evidence.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dsv4_operator.api.engine import Capability
from dsv4_operator.api.roles import ROLES, Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import Severity
from dsv4_operator.engine.effective import EffectiveRole, effective_role, gpus_needed, parse_args
from dsv4_operator.engine.ownership import (
    OWNED_ENV,
    OWNED_FLAGS,
    TRANSFER_FORMAT_ENV,
    TRANSFER_FORMAT_FLAGS,
)
from dsv4_operator.engine.planner import GIB, MemoryPlan, Profiles
from dsv4_operator.engine.releases import FORK_ENV, EngineRelease, Option, supported_versions

NOTES = "docs/engine-notes.md"


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
    plan: MemoryPlan
    roles: dict[Role, EffectiveRole]

    @property
    def release(self) -> EngineRelease:
        return self.profiles.release

    @property
    def bf16(self) -> bool:
        return self.spec.engine.index_k_dtype == "bf16"

    def has(self, capability: Capability) -> bool:
        return capability in self.spec.engine.capabilities

    def passthrough(self) -> Iterator[tuple[str, tuple[str, ...], list[str]]]:
        """(spec path, extraArgs, env names) of the engine-wide and per-role passthroughs."""
        engine = self.spec.engine
        yield "spec.engine", tuple(engine.extra_args), [e.name for e in engine.env]
        for role in ROLES:
            o = self.spec.role(role).overrides
            yield f"spec.{role}.overrides", tuple(o.extra_args), [e.name for e in o.env]


CheckFn = Callable[[RuleContext], Iterator[Hit]]


@dataclass(frozen=True)
class Rule:
    """One catalogue entry: its metadata and its check."""

    id: str
    title: str
    severity: Severity
    acknowledgeable: bool
    reference: str
    fixed_by: Capability | None
    reads: tuple[str, ...]
    releases: tuple[str, ...]
    check: CheckFn

    def applies_to(self, version: str) -> bool:
        return version in self.releases

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "title": self.title,
            "severity": self.severity,
            "acknowledgeable": self.acknowledgeable,
            "reference": self.reference,
            "fixedBy": self.fixed_by.value if self.fixed_by else None,
            "reads": list(self.reads),
            "releases": list(self.releases),
        }


CATALOGUE: list[Rule] = []


def rule(
    id: str,
    title: str,
    severity: Severity,
    *,
    reference: str,
    reads: tuple[str, ...],
    ack: bool = True,
    fixed_by: Capability | None = None,
    releases: tuple[str, ...] | None = None,
) -> Callable[[CheckFn], CheckFn]:
    """Register the decorated check in the catalogue (kept in id order)."""

    def register(check: CheckFn) -> CheckFn:
        CATALOGUE.append(
            Rule(
                id=id,
                title=title,
                severity=severity,
                acknowledgeable=ack,
                reference=reference,
                fixed_by=fixed_by,
                reads=reads,
                releases=releases if releases is not None else tuple(supported_versions()),
                check=check,
            )
        )
        return check

    return register


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


@rule(
    "DSV4-R005",
    "overlap scheduler with PD disaggregation",
    "warning",
    reference="sglang #27938, #28039, #32209",
    reads=("engine.overlap.scheduler", "<role>.overrides.overlap"),
)
def overlap_scheduler_with_pd(ctx: RuleContext) -> Iterator[Hit]:
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


@rule(
    "DSV4-R006",
    "maxRunningRequests above cudaGraphMaxBs (eager fallback)",
    "warning",
    reference=f"{NOTES}#eager-decode-fallback",
    reads=("engine.maxRunningRequests", "engine.cudaGraphMaxBs", "decode.overrides"),
)
def running_requests_above_graph_size(ctx: RuleContext) -> Iterator[Hit]:
    eff = ctx.roles["decode"]  # the decode graph size is what bounds eager fallback
    if eff.max_running_requests > eff.cuda_graph_max_bs:
        flag = ctx.release.cuda_graph_max_bs_flag.get("decode", "--cuda-graph-max-bs")
        yield Hit(
            "spec.engine.maxRunningRequests",
            f"decode maxRunningRequests {eff.max_running_requests} > cudaGraphMaxBs "
            f"{eff.cuda_graph_max_bs} ({flag}): batches above the captured size run the slow "
            'eager path (sglang:cuda_graph_passes_total{mode="decode_none"}). Raise '
            "cudaGraphMaxBs or lower maxRunningRequests.",
        )


@rule(
    "DSV4-R007",
    "GPUs requested differ from what the parallelism needs",
    "error",
    reference=f"{NOTES}#one-replica-one-node",
    reads=(
        "<role>.tensorParallel",
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
        yield Hit(
            "spec.workload.concurrentSessions",
            f"decode holds {plan.sessions_capacity} sessions of "
            f"{ctx.spec.workload.context_tokens} tokens ({plan.max_total_tokens} tokens per "
            f"rank x {plan.replicas} replicas) but the workload wants {wanted}: expect "
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


def _flag_state(flags: dict[str, tuple[int, str | None]], flag: str) -> str:
    if flag not in flags:
        return "unset"
    value = flags[flag][1]
    return "set" if value is None else value


@rule(
    "DSV4-R011",
    "transfer-format setting differs between roles",
    "error",
    reference=f"{NOTES}#transfer-format",
    reads=("<role>.overrides.extraArgs", "<role>.overrides.env"),
    ack=False,
)
def transfer_format_differs(ctx: RuleContext) -> Iterator[Hit]:
    pre, dec = ctx.roles["prefill"], ctx.roles["decode"]
    pre_flags, dec_flags = pre.flags, dec.flags
    for flag in sorted(TRANSFER_FORMAT_FLAGS):
        a, b = _flag_state(pre_flags, flag), _flag_state(dec_flags, flag)
        if a != b:
            yield Hit(
                "spec.decode.overrides.extraArgs"
                if flag in parse_args(dec.role_extra_args, dec.catalog)
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


@rule(
    "DSV4-R012",
    "trtllm DSV4 attention or unified FP8 KV with PD",
    "error",
    reference=f"sglang #37838; {NOTES}#pd-refusals",
    reads=("engine.extraArgs", "engine.env"),
    ack=False,
    releases=("0.5.23",),
)
def layout_refused_with_pd(ctx: RuleContext) -> Iterator[Hit]:
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
                f"PD transfer and the engine refuses PD with it ({NOTES}#pd-refusals). Remove it.",
            )


@rule(
    "DSV4-R013",
    "passthrough sets a flag or env var the operator owns",
    "error",
    reference=f"{NOTES}#owned-flags",
    reads=("engine.extraArgs", "engine.env", "<role>.overrides"),
    ack=False,
)
def passthrough_sets_owned(ctx: RuleContext) -> Iterator[Hit]:
    parser = ctx.release.engine
    for prefix, args, env_names in ctx.passthrough():
        for token in args:
            if not token.startswith("--"):
                continue
            resolution = parser.resolve(token)
            owned = sorted(
                {f for o in resolution.options for f in _spellings(o) if f in OWNED_FLAGS}
            )
            if owned:
                yield Hit(
                    f"{prefix}.extraArgs",
                    f"{token.split('=', 1)[0]} "
                    f"{'can resolve' if resolution.ambiguous else 'resolves'} to {owned[0]}, "
                    "which the operator owns; "
                    f"use {OWNED_FLAGS[owned[0]]} instead.",
                )
        for name in env_names:
            if name in OWNED_ENV:
                yield Hit(
                    f"{prefix}.env",
                    f"{name} is owned by the operator; use {OWNED_ENV[name]} instead.",
                )


def _spellings(option: Option) -> set[str]:
    """Every name of an option, including the canonical one the ownership table uses."""
    return {*option.flags, "--" + option.dest.replace("_", "-")}


@rule(
    "DSV4-R014",
    "tool-call or reasoning parser does not match the model",
    "error",
    reference=f"sglang #17593, #40236; {NOTES}#parsers",
    reads=("engine.toolCallParser", "engine.reasoningParser", "model.profile"),
)
def parser_mismatch(ctx: RuleContext) -> Iterator[Hit]:
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
            f"{model.reasoning_parser!r} ({NOTES}#parsers).",
        )


@rule(
    "DSV4-R015",
    "custom chat template on DeepSeek-V4",
    "warning",
    reference=f"sglang #17593; {NOTES}#parsers",
    reads=("engine.extraArgs",),
)
def custom_chat_template(ctx: RuleContext) -> Iterator[Hit]:
    for role, eff in ctx.roles.items():
        if ctx.profiles.model.family == "dsv4" and "--chat-template" in eff.flags:
            yield Hit(
                "spec.engine.extraArgs",
                f"--chat-template on {role} for DeepSeek-V4: the model's own template emits the "
                "DSML the parser expects; a custom one has produced content-only tool calls "
                "(sglang #17593). Remove it unless it is DSML-exact.",
            )
            return


@rule(
    "DSV4-R016",
    "KV cache dtype the DSV4 CUDA pool does not store",
    "error",
    reference=f"sglang PR #33413; {NOTES}#kv-cache-dtype",
    reads=("engine.kvCacheDtype", "model.profile"),
)
def kv_dtype_not_stored(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.profiles.model.family == "dsv4" and ctx.spec.engine.kv_cache_dtype != "fp8_e4m3":
        yield Hit(
            "spec.engine.kvCacheDtype",
            f"kvCacheDtype {ctx.spec.engine.kv_cache_dtype} with DeepSeek-V4: on CUDA the DSV4 "
            "pool stores fp8_e4m3 (584 B/token); fp8_e5m2 is refused and bfloat16 is the NPU "
            "layout (bf16 KV on CUDA is the unmerged PR #33413). Use fp8_e4m3.",
        )


@rule(
    "DSV4-R017",
    "HiCache with speculative decoding on DeepSeek-V4",
    "warning",
    reference="sglang #30532",
    reads=("engine.hicache.enabled", "extraArgs --speculative-algorithm"),
)
def hicache_with_speculative(ctx: RuleContext) -> Iterator[Hit]:
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


@rule(
    "DSV4-R018",
    "passthrough flag the release's parser does not accept",
    "error",
    reference=f"{NOTES}#supported-releases",
    reads=("engine.extraArgs", "<role>.overrides.extraArgs", "engine.sglangVersion"),
    ack=False,
)
def flag_unknown_to_release(ctx: RuleContext) -> Iterator[Hit]:
    parser, version = ctx.release.engine, ctx.release.version
    for prefix, args, _ in ctx.passthrough():
        for token in args:
            if not token.startswith("--"):
                continue
            resolution = parser.resolve(token)
            name = token.split("=", 1)[0]
            if resolution.unknown:
                near = parser.closest(name)
                hint = f"; did you mean {' or '.join(near)}?" if near else ""
                yield Hit(
                    f"{prefix}.extraArgs",
                    f"{name} is not a flag of SGLang {version}: its parser would refuse to "
                    f"start{hint}",
                )
            elif resolution.ambiguous:
                matches = ", ".join(sorted(f for o in resolution.options for f in o.flags)[:6])
                yield Hit(
                    f"{prefix}.extraArgs",
                    f"{name} is an ambiguous abbreviation for SGLang {version} (could match "
                    f"{matches}): its parser would refuse to start. Spell the flag out.",
                )


@rule(
    "DSV4-R019",
    "passthrough env name the release does not know",
    "warning",
    reference=f"{NOTES}#supported-releases",
    reads=("engine.env", "<role>.overrides.env", "engine.sglangVersion"),
)
def env_unknown_to_release(ctx: RuleContext) -> Iterator[Hit]:
    known = ctx.release.env
    for prefix, _, env_names in ctx.passthrough():
        for name in env_names:
            if not name.startswith("SGLANG_") or name in known or name in FORK_ENV:
                continue
            near = _closest(name, known)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            yield Hit(
                f"{prefix}.env",
                f"{name} is not in SGLang {ctx.release.version}'s environment registry, so the "
                f"engine ignores it{hint}",
            )


def _closest(name: str, known: frozenset[str]) -> list[str]:
    return difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.8)


# Passthrough settings that change the pool arithmetic in ways the planner does not model.
_UNMODELLED_FLAGS = {
    "--enable-hisparse": "HiSparse shrinks the device C4 pool",
    "--enable-encoder-swa-bounded-replay": "encoder replay moves the SWA pool into request windows",
}
_UNMODELLED_ENV = {
    "SGLANG_DSV4_KV_LAYOUT": "v4",
    "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "auto",
    "SGLANG_OPT_USE_ONLINE_COMPRESS": "",
}


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
                    "spec.engine.extraArgs",
                    f"{flag} on {role}: {why}, which the operator's memory plan does not model, "
                    "so the pinned --max-total-tokens would be wrong. Remove it, or acknowledge "
                    "this rule and check the engine's `DSV4 pool sizes` log line yourself.",
                )
        for name, default in _UNMODELLED_ENV.items():
            value = eff.env_map.get(name)
            if value is not None and value.strip().lower() not in (default, "", "0", "false"):
                yield Hit(
                    "spec.engine.env",
                    f"{name}={value} on {role} changes the KV pool layout or state sizing, which "
                    "the operator's memory plan does not model. Remove it, or acknowledge this "
                    "rule and check the engine's `DSV4 pool sizes` log line yourself.",
                )


@rule(
    "DSV4-R021",
    "speculative algorithm DeepSeek-V4 does not run",
    "error",
    reference=f"{NOTES}#speculative-decoding",
    reads=("extraArgs --speculative-algorithm/--speculative-eagle-topk", "model.profile"),
    ack=False,
)
def speculative_algorithm_refused(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.profiles.model.family != "dsv4":
        return
    for role, eff in ctx.roles.items():
        algorithm = eff.flags.get("--speculative-algorithm", (0, None))[1]
        if algorithm is None:
            continue
        if algorithm not in ("EAGLE", "DSPARK"):
            problem = f"--speculative-algorithm {algorithm}: only EAGLE or DSPARK run"
        elif algorithm == "EAGLE" and (
            eff.flags.get("--speculative-eagle-topk", (0, None))[1] != "1"
            or "--speculative-num-steps" not in eff.flags
            or "--speculative-num-draft-tokens" not in eff.flags
        ):
            problem = (
                "EAGLE needs --speculative-eagle-topk 1 together with --speculative-num-steps "
                "and --speculative-num-draft-tokens (automatic choice asserts without them)"
            )
        else:
            continue
        yield Hit(
            "spec.engine.extraArgs",
            f"{problem} on {role}: SGLang {ctx.release.version} refuses to start DeepSeek-V4 "
            "otherwise.",
        )
        return


CATALOGUE.sort(key=lambda r: r.id)
RULES_BY_ID: dict[str, Rule] = {r.id: r for r in CATALOGUE}


def context(spec: DSV4DeploymentSpec, profiles: Profiles, plan: MemoryPlan) -> RuleContext:
    return RuleContext(
        spec=spec,
        profiles=profiles,
        plan=plan,
        roles={role: effective_role(spec, role) for role in ROLES},
    )


def run_rules(ctx: RuleContext) -> list[tuple[Rule, Hit]]:
    """Every (rule, hit) of the rules that apply to the spec's release, in catalogue order."""
    version = ctx.release.version
    return [(r, hit) for r in CATALOGUE if r.applies_to(version) for hit in r.check(ctx)]

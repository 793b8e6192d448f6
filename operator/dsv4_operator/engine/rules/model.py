"""Model rules: the parsers, chat template, KV dtype and speculative decoding the model needs."""

from __future__ import annotations

from collections.abc import Iterator

from dsv4_operator.engine.rules.catalogue import NOTES, Hit, RuleContext, rule


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

"""Pairing rules: prefill and decode agree on the P/D transfer format, in a layout PD accepts."""

from __future__ import annotations

from collections.abc import Iterator

from dsv4_operator.engine.effective import parse_args
from dsv4_operator.engine.ownership import TRANSFER_FORMAT_ENV, TRANSFER_FORMAT_FLAGS
from dsv4_operator.engine.rules.catalogue import NOTES, Hit, RuleContext, rule


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

"""Pairing rules: prefill and decode agree on every setting their release pairs, in a layout PD
accepts."""

from __future__ import annotations

from collections.abc import Iterator

from dsv4_operator.api.roles import Role
from dsv4_operator.engine.effective import EffectiveRole
from dsv4_operator.engine.flags import KV_CHECKSUM_FLAG
from dsv4_operator.engine.ownership import OWNED_ENV, OWNED_FLAGS
from dsv4_operator.engine.releases import PairedSetting, SourceLine
from dsv4_operator.engine.rules.catalogue import NOTES, Change, Hit, RuleContext, rule


def _flag_state(eff: EffectiveRole, flag: str) -> str:
    flags = eff.flags
    if flag not in flags:
        return "unset"
    value = flags[flag][1]
    return "set" if value is None else value


def _env_state(eff: EffectiveRole, name: str) -> str:
    return eff.env_map.get(name, "unset")


def _differs(setting: PairedSetting, what: str, pre: str, dec: str, version: str) -> str:
    if "unset" in (pre, dec):
        how = f"is set on {'decode' if pre == 'unset' else 'prefill'} only"
    else:
        how = "differs between the roles"
    return (
        f"{what} {how} (prefill {pre}, decode {dec}): SGLang {version} needs "
        f"{setting.setting} equal on prefill and decode; otherwise {setting.on_mismatch}."
    )


def _overriding(field_of_decode: str) -> Role:
    """The role whose overrides make the difference: decode's when they set it, else prefill's."""
    return "decode" if field_of_decode.startswith("spec.decode.") else "prefill"


@rule(
    "DSV4-R011",
    "a setting the release pairs differs between roles",
    "error",
    reference=f"{NOTES}#transfer-format; docs/releases.md#pairing",
    reads=("<role>.overrides.extraArgs", "<role>.overrides.env", "engine.sglangVersion"),
    ack=False,
)
def transfer_format_differs(ctx: RuleContext) -> Iterator[Hit]:
    pre, dec = ctx.roles["prefill"], ctx.roles["decode"]
    version = ctx.release.version
    seen: set[str] = set()
    for setting in ctx.release.pairing:
        spellings = (
            ("extraArgs", setting.flags, OWNED_FLAGS, _flag_state, ctx.flag_field),
            ("env", setting.env, OWNED_ENV, _env_state, ctx.env_field),
        )
        for kind, names, owned, state, field_of in spellings:
            # Owned names are rendered once for both roles; a passthrough of one is DSV4-R013.
            for name in (n for n in names if n not in owned and n not in seen):
                seen.add(name)
                a, b = state(pre, name), state(dec, name)
                if a != b:
                    yield Hit(
                        field_of(_overriding(field_of("decode", name)), name),
                        _differs(setting, name, a, b, version)
                        + f" Set it once in spec.engine.{kind}.",
                    )


@rule(
    "DSV4-R012",
    "trtllm DSV4 attention or unified FP8 KV with PD",
    "error",
    reference=f"sglang #37838; {NOTES}#pd-refusals",
    reads=("engine.extraArgs", "engine.env"),
    ack=False,
    introduced_in=Change(
        "0.5.23",
        proof=SourceLine(
            "srt/arg_groups/deepseek_v4_hook.py",
            "--dsv4-attn-backend trtllm does not support PD disaggregation yet",
        ),
    ),
)
def layout_refused_with_pd(ctx: RuleContext) -> Iterator[Hit]:
    for role, eff in ctx.roles.items():
        backend = eff.flags.get("--dsv4-attn-backend")
        if backend is not None and backend[1] == "trtllm":
            yield Hit(
                ctx.flag_field(role, "--dsv4-attn-backend"),
                f"--dsv4-attn-backend trtllm on {role}: its uniform-FP8 512 B layout is not in "
                "the PD handshake and the engine asserts disaggregation_mode == null "
                "(sglang #37838). Remove it.",
            )
        if eff.env_map.get("SGLANG_DSV4_UNIFIED_KV_FP8", "0") not in ("", "0", "false", "False"):
            yield Hit(
                ctx.env_field(role, "SGLANG_DSV4_UNIFIED_KV_FP8"),
                f"SGLANG_DSV4_UNIFIED_KV_FP8 on {role}: the unified layout drops the rope pool in "
                f"PD transfer and the engine refuses PD with it ({NOTES}#pd-refusals). Remove it.",
            )


@rule(
    "DSV4-R022",
    "decode-side HiSparse with PD on DeepSeek-V4 before the host/device KV index split",
    "error",
    reference=f"sglang #31482, PR #31901; {NOTES}#hisparse-in-pd",
    reads=("extraArgs --enable-hisparse", "model.profile"),
    fixed_in=Change(
        "0.5.23",
        ref="PR #31901 (fixes #31482)",
        proof=SourceLine("srt/disaggregation/mooncake/conn.py", "dst_device_kv_indices"),
    ),
)
def hisparse_pd_page_indices(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.profiles.model.family != "dsv4":
        return
    for role, eff in ctx.roles.items():
        if "--enable-hisparse" in eff.flags:
            yield Hit(
                ctx.flag_field(role, "--enable-hisparse"),
                f"--enable-hisparse on {role} with PD on SGLang {ctx.release.version}: the "
                "direct-to-host transfer writes the device C4-indexer and C128 buffers at the "
                "host page indices, which HiSparse allocates independently, so decode reads "
                "another request's KV: lower accuracy and malformed DSML tool calls (sglang "
                "#31482, fixed by PR #31901). Remove it, or use a release with the fix.",
            )
            return


@rule(
    "DSV4-R023",
    "KV checksum required on a release without it",
    "error",
    reference=f"{NOTES}#kv-checksum",
    reads=("transfer.kvChecksum", "engine.sglangVersion"),
    ack=False,
)
def kv_checksum_unsupported(ctx: RuleContext) -> Iterator[Hit]:
    if ctx.spec.transfer.kv_checksum and not ctx.release.has_flag(KV_CHECKSUM_FLAG):
        yield Hit(
            "spec.transfer.kvChecksum",
            f"kvChecksum true, but SGLang {ctx.release.version} has no {KV_CHECKSUM_FLAG}: its "
            "parser would refuse to start. Leave kvChecksum unset "
            "(on where the release has it), or use a release that has it.",
        )

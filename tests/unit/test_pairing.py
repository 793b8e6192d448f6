"""Engine knowledge per release: the settings each release pairs between prefill and decode,
the KV checksum, the KV layouts the planner plans with, and the releases each rule applies to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dsv4_operator.api.roles import ROLES
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.flags import KV_CHECKSUM_FLAG, engine_launch
from dsv4_operator.engine.kv_layout import (
    V4,
    V41,
    V41_FP4,
    V41_FP4_NEW,
    V41_NEW,
    KvLayouts,
    LayoutRefused,
    select_layouts,
)
from dsv4_operator.engine.ownership import OWNED_FLAGS
from dsv4_operator.engine.planner import plan
from dsv4_operator.engine.releases import FORK_ENV, releases, version_key
from dsv4_operator.engine.validation import validate_spec
from dsv4_operator.revisions.hashing import transfer_format_key

Variant = Callable[..., dict[str, Any]]
V0523 = {"engine.sglangVersion": "0.5.23", "engine.capabilities": []}
B200 = {**V0523, "gpu.product": "NVIDIA-B200"}
POLICY = "--disaggregation-decode-allocation-policy"

PAIRED = {
    "0.5.16": {
        "pageSize",
        "kvCacheDtype",
        "indexKDtype",
        "compressStateDtype",
        "onlineCompress",
        "attentionBackend",
        "speculative",
    },
}
PAIRED["0.5.23"] = PAIRED["0.5.16"] | {
    "kvLayout",
    "compressedKvLayout",
    "unifiedKvFp8",
    "dsparkLayout",
    "decodeAllocationPolicy",
    "kvChecksum",
    "samplingMask",
}


def _findings(spec: dict[str, Any], rule: str) -> list[Any]:
    return [f for f in validate_spec(spec).findings if f.rule == rule]


def _launches(spec: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    parsed = DSV4DeploymentSpec.model_validate(spec)
    memory = plan(parsed)
    return {role: engine_launch(parsed, memory, role, "m").command for role in ROLES}


# --- the pairing list per release --------------------------------------------------------------


@pytest.mark.parametrize("version", sorted(PAIRED))
def test_each_release_lists_what_it_pairs(version: str) -> None:
    assert {p.setting for p in releases()[version].pairing} == PAIRED[version]


@pytest.mark.parametrize("version", sorted(PAIRED))
def test_paired_names_are_the_releases_own(version: str) -> None:
    release = releases()[version]
    for setting in release.pairing:
        for flag in setting.flags:
            [option] = release.engine.resolve(flag).options
            assert flag == "--" + option.dest.replace("_", "-"), (setting.setting, flag)
        for name in setting.env:
            assert name in release.env or name in FORK_ENV, (setting.setting, name)


def test_what_a_release_pairs_needs_no_flag_it_lacks() -> None:
    old = releases()["0.5.16"]
    assert not old.has_flag(KV_CHECKSUM_FLAG) and not old.has_flag(POLICY)
    assert releases()["0.5.23"].has_flag(KV_CHECKSUM_FLAG)


# --- a one-sided setting is refused, naming the role and the field -----------------------------


def test_decode_only_kv_layout_names_decode_and_its_field(variant: Variant) -> None:
    spec = variant(
        {**B200, "decode.overrides": {"env": [{"name": "SGLANG_DSV4_KV_LAYOUT", "value": "v41"}]}}
    )
    [hit] = _findings(spec, "DSV4-R011")
    assert hit.severity == "error" and hit.field == "spec.decode.overrides.env"
    assert "set on decode only" in hit.message and "kvLayout" in hit.message
    assert "refuses the prefill at bootstrap" in hit.message
    assert not _findings(spec, "DSV4-R020")  # the planner models the layout now


def test_prefill_only_flag_names_prefill(variant: Variant) -> None:
    spec = variant({**V0523, "prefill.overrides": {"extraArgs": [POLICY, "prefill_complete"]}})
    [hit] = _findings(spec, "DSV4-R011")
    assert hit.field == "spec.prefill.overrides.extraArgs" and "prefill only" in hit.message
    assert "decodeAllocationPolicy" in hit.message


def test_both_roles_overriding_differently_is_refused(variant: Variant) -> None:
    spec = variant(
        {
            **V0523,
            "prefill.overrides": {"extraArgs": [POLICY, "early"]},
            "decode.overrides": {"extraArgs": [POLICY, "prefill_complete"]},
        }
    )
    [hit] = _findings(spec, "DSV4-R011")
    assert hit.field == "spec.decode.overrides.extraArgs" and "differs" in hit.message


def test_the_same_value_on_both_roles_is_fine(variant: Variant) -> None:
    spec = variant(
        {
            **V0523,
            "prefill.overrides": {"extraArgs": [POLICY, "prefill_complete"]},
            "decode.overrides": {"extraArgs": [POLICY, "prefill_complete"]},
        }
    )
    assert not _findings(spec, "DSV4-R011")


def test_a_prefix_of_a_paired_flag_is_the_flag(variant: Variant) -> None:
    spec = variant(
        {**V0523, "decode.overrides": {"extraArgs": ["--disaggregation-decode-alloc", "early"]}}
    )
    [hit] = _findings(spec, "DSV4-R011")
    assert POLICY in hit.message


def test_an_invalid_choice_is_refused(variant: Variant) -> None:
    for args in ([POLICY, "fifo"], [f"{POLICY}=fifo"], ["--disaggregation-decode-alloc", "fifo"]):
        [hit] = _findings(variant({**V0523, "engine.extraArgs": args}), "DSV4-R018")
        assert "fifo" in hit.message and "prefill_complete" in hit.message
    assert not _findings(variant({**V0523, "engine.extraArgs": [POLICY, "early"]}), "DSV4-R018")


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
@pytest.mark.parametrize("where", ["engine.extraArgs", "decode.overrides"])
def test_page_size_is_owned_in_every_spelling(version: str, where: str, variant: Variant) -> None:
    for token in ("--page-size", "--page-si", "--page-size=1"):
        args = [token, "1"] if "=" not in token else [token]
        value: Any = args if where == "engine.extraArgs" else {"extraArgs": args}
        spec = variant({"engine.sglangVersion": version, "engine.capabilities": [], where: value})
        [hit] = _findings(spec, "DSV4-R013")
        assert "--page-size" in hit.message and hit.severity == "error"
        assert hit.field.endswith("extraArgs")
    assert OWNED_FLAGS["--page-size"].startswith("nothing")


# --- the KV checksum -------------------------------------------------------------------------


def test_kv_checksum_is_on_by_default_where_the_release_has_it(variant: Variant) -> None:
    on = _launches(variant(V0523))
    assert all(KV_CHECKSUM_FLAG in argv for argv in on.values())
    off = _launches(variant({**V0523, "transfer.kvChecksum": False}))
    assert not any(KV_CHECKSUM_FLAG in argv for argv in off.values())
    old = _launches(variant({}))  # 0.5.16 has no such flag
    assert not any(KV_CHECKSUM_FLAG in argv for argv in old.values())


def test_kv_checksum_true_on_a_release_without_it_is_refused(variant: Variant) -> None:
    [hit] = _findings(variant({"transfer.kvChecksum": True}), "DSV4-R023")
    assert hit.field == "spec.transfer.kvChecksum" and "0.5.16" in hit.message
    assert not _findings(variant({**V0523, "transfer.kvChecksum": True}), "DSV4-R023")
    assert not _findings(variant({"transfer.kvChecksum": False}), "DSV4-R023")


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_kv_checksum_in_one_roles_extra_args_is_refused(role: str, variant: Variant) -> None:
    spec = variant({**V0523, f"{role}.overrides": {"extraArgs": ["--disaggregation-enable-kv"]}})
    [hit] = _findings(spec, "DSV4-R013")
    assert hit.field == f"spec.{role}.overrides.extraArgs"
    assert "spec.transfer.kvChecksum" in hit.message and f"for {role} only" in hit.message


def test_transfer_key_follows_the_paired_settings(variant: Variant) -> None:
    def key(changes: dict[str, Any]) -> str:
        return transfer_format_key(DSV4DeploymentSpec.model_validate(variant(changes)))

    base = key(B200)
    assert key({**B200, "transfer.kvChecksum": False}) != base
    assert key({**B200, "transfer.kvChecksum": True}) == base  # what null renders there
    layout = [{"name": "SGLANG_DSV4_KV_LAYOUT", "value": "v41"}]
    assert key({**B200, "engine.env": layout}) != base
    assert key({**B200, "engine.extraArgs": [POLICY, "prefill_complete"]}) != base
    assert key({**B200, "engine.extraArgs": ["--enable-metrics-for-all-schedulers"]}) == base
    # a release without the checksum keeps the key it had before the checksum existed
    assert key({"transfer.kvChecksum": False}) == key({})


# --- KV layouts ------------------------------------------------------------------------------


def test_layout_bytes_follow_the_release_table() -> None:
    # kv_layout.py: page_bytes pads a page to the reader's TMA row stride
    assert V4.page_bytes(256) == 256 * 585 and V4.page_bytes(2) == 1728
    assert V41.bytes_per_token(256) == 528 and V41.bytes_per_token(2) == 768
    assert V41_NEW.page_bytes(64) == 64 * 528
    assert V41_FP4.bytes_per_token(64) == 288 and V41_FP4_NEW.bytes_per_token(2) == 288


@pytest.mark.parametrize(
    ("env", "backend", "arch", "main", "c4"),
    [
        ({}, None, "sm100", "v4", "v4"),
        ({"SGLANG_DSV4_KV_LAYOUT": "auto"}, None, "sm90", "v4", "v4"),
        ({"SGLANG_DSV4_KV_LAYOUT": "AUTO"}, None, "sm100", "v41", "v41"),
        ({"SGLANG_DSV4_KV_LAYOUT": "v41"}, None, "sm100", "v41", "v41"),
        (
            {"SGLANG_DSV4_KV_LAYOUT": "v41_new", "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "fp4"},
            None,
            "sm100",
            "v41_new",
            "v41_fp4_new",
        ),
        ({"SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "fp8"}, None, "sm90", "v4", "v4"),
        ({}, "flashmla_mega", "sm100", "v41", "v41"),
        ({}, "trtllm", "sm100", "uniform_fp8", "uniform_fp8"),
    ],
)
def test_layout_selection(
    env: dict[str, str], backend: str | None, arch: str, main: str, c4: str
) -> None:
    layouts = select_layouts(env, backend, arch)
    assert (layouts.main.name, layouts.compressed(4).name) == (main, c4)


@pytest.mark.parametrize(
    ("env", "backend", "arch"),
    [
        ({"SGLANG_DSV4_KV_LAYOUT": "v41"}, None, "sm90"),
        ({"SGLANG_DSV4_KV_LAYOUT": "v41"}, None, None),
        ({"SGLANG_DSV4_KV_LAYOUT": "v5"}, None, "sm100"),
        ({"SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "fp4"}, None, "sm100"),
        ({"SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "int4"}, None, "sm100"),
        ({"SGLANG_DSV4_KV_LAYOUT": "v41"}, "trtllm", "sm100"),
    ],
)
def test_layouts_the_release_refuses(
    env: dict[str, str], backend: str | None, arch: str | None
) -> None:
    with pytest.raises(LayoutRefused):
        select_layouts(env, backend, arch)


def test_pd_layout_string() -> None:
    assert KvLayouts(V4).pd_layout((0, 4, 128)) == "v4,c4:v4,c128:v4"
    assert KvLayouts(V41, "fp4").pd_layout((4, 128)) == "v41,c4:v41_fp4,c128:v41_fp4"


def test_the_planner_plans_the_selected_layout(variant: Variant) -> None:
    def bytes_per_token(changes: dict[str, Any]) -> float:
        parsed = DSV4DeploymentSpec.model_validate(variant(changes))
        return plan(parsed).roles["decode"].bytes_per_full_token

    v4 = bytes_per_token(B200)
    assert v4 == pytest.approx(7086.75)
    v41 = bytes_per_token(
        {**B200, "engine.env": [{"name": "SGLANG_DSV4_KV_LAYOUT", "value": "v41"}]}
    )
    # SWA 0.1 x (43 x 528 + 21 x 8/256 x 10,240) + C4 21 x (528 + 132)/4 + C128 20 x 768/128
    assert v41 == pytest.approx(0.1 * (43 * 528 + 21 * 8 / 256 * 10240) + 21 * 660 / 4 + 20 * 6)
    # 0.5.16 has no such setting (DSV4-R019 says the engine ignores it): one layout
    old = {
        "gpu.product": "NVIDIA-B200",
        "engine.env": [{"name": "SGLANG_DSV4_KV_LAYOUT", "value": "v41"}],
    }
    assert bytes_per_token(old) == bytes_per_token({"gpu.product": "NVIDIA-B200"})


# --- rules know their releases -----------------------------------------------------------------


def test_rules_carry_their_releases() -> None:
    from dsv4_operator.engine.rules import RULES_BY_ID

    assert RULES_BY_ID["DSV4-R022"].releases == ("0.5.16",)
    assert RULES_BY_ID["DSV4-R022"].as_dict()["fixedIn"] == {
        "version": "0.5.23",
        "ref": "PR #31901 (fixes #31482)",
    }
    assert RULES_BY_ID["DSV4-R012"].releases == ("0.5.23",)
    assert RULES_BY_ID["DSV4-R024"].releases == ("0.5.23",)
    r005 = RULES_BY_ID["DSV4-R005"]
    assert r005.releases == ("0.5.23", "0.5.16")
    assert {c.version for c in r005.related_fixes} == {"0.5.14"}
    assert "#28039" not in r005.reference.split(";")[0]


def test_version_order() -> None:
    assert version_key("0.5.9") < version_key("0.5.16") < version_key("0.5.16.post1")
    assert version_key("0.5.16.post1") < version_key("0.5.23")


def test_hisparse_pd_rule_fires_only_where_it_applies(variant: Variant) -> None:
    hisparse = {"decode.overrides": {"extraArgs": ["--enable-hisparse"]}}
    [hit] = _findings(variant(hisparse), "DSV4-R022")
    assert hit.field == "spec.decode.overrides.extraArgs" and "#31482" in hit.message
    assert not _findings(variant({**V0523, **hisparse}), "DSV4-R022")
    # DSV4-R020 names the role's own field too
    [r020] = _findings(variant({**V0523, **hisparse}), "DSV4-R020")
    assert r020.field == "spec.decode.overrides.extraArgs"

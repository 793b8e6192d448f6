"""Each rule fires on its condition and stays quiet just outside it; the safety policy applies."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dsv4_operator.engine.rules import CATALOGUE, RULES_BY_ID
from dsv4_operator.engine.validation import validate_spec
from tests.support.cases import spellings_of_owned_flags

BF16 = {"engine.indexKDtype": "bf16", "engine.capabilities": ["bf16IndexK", "poolSizingFix"]}
EAGLE = [
    "--speculative-algorithm",
    "EAGLE",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-steps",
    "3",
    "--speculative-num-draft-tokens",
    "4",
]
V0523 = {"engine.sglangVersion": "0.5.23", "engine.capabilities": []}
POLICY = "--disaggregation-decode-allocation-policy"
V32 = {
    "model.profile": "deepseek-v3.2",
    "model.checkpoint": "fp8",
    "engine.toolCallParser": "deepseekv32",
    "engine.reasoningParser": "deepseek-v3",
}

# rule -> (changes that trigger it, nearby changes that must not)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "DSV4-R001": (
        {**BF16, "engine.hicache": {"enabled": True}},
        {
            **BF16,
            "engine.hicache": {"enabled": True},
            "engine.capabilities": ["bf16IndexK", "poolSizingFix", "indexKHiCacheGate"],
        },
    ),
    "DSV4-R002": (
        {**BF16, "engine.overlap.multiStream": True},
        {"engine.overlap.multiStream": True},
    ),
    "DSV4-R003": (
        {"engine.indexKDtype": "bf16", "engine.capabilities": ["poolSizingFix"]},
        BF16,
    ),
    "DSV4-R004": (
        # 0.5.16 runs the FP4 indexer on sm100 only, 0.5.23 on sm120 too
        {
            "engine.indexKDtype": "fp4",
            "gpu.product": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
        },
        {**V0523, "engine.indexKDtype": "fp4"},
    ),
    "DSV4-R005": (
        {"decode.overrides": {"overlap": {"scheduler": True}}},
        {"engine.overlap.scheduler": False},
    ),
    "DSV4-R006": (
        {"engine.maxRunningRequests": 128, "engine.cudaGraphMaxBs": 64},
        {"engine.maxRunningRequests": 64, "engine.cudaGraphMaxBs": 64},
    ),
    "DSV4-R007": (
        {"decode.extraArgs": None, "decode.overrides": {"extraArgs": ["--dp-size", "4"]}},
        {"decode.overrides": {"extraArgs": ["--dp-size", "4", "--enable-dp-attention"]}},
    ),
    "DSV4-R008": (
        V32,
        {
            **V32,
            "gpu.product": "NVIDIA-B200",
            "prefill.tensorParallel": 8,
            "decode.tensorParallel": 8,
        },
    ),
    "DSV4-R009": (
        {"workload.concurrentSessions": 200},
        {"workload.concurrentSessions": 200, "decode.replicas": 3},
    ),
    "DSV4-R010": (
        {"engine.indexKDtype": "bf16", "engine.capabilities": ["bf16IndexK"]},
        {"engine.indexKDtype": "fp4", "engine.capabilities": []},
    ),
    "DSV4-R011": (
        {**V0523, "decode.overrides": {"extraArgs": [POLICY, "prefill_complete"]}},
        {**V0523, "engine.extraArgs": [POLICY, "prefill_complete"]},
    ),
    "DSV4-R012": (
        {**V0523, "engine.env": [{"name": "SGLANG_DSV4_UNIFIED_KV_FP8", "value": "1"}]},
        {**V0523, "engine.env": [{"name": "SGLANG_DSV4_UNIFIED_KV_FP8", "value": "0"}]},
    ),
    "DSV4-R013": (
        {"engine.extraArgs": ["--max-total-tokens=100000"]},
        {"engine.extraArgs": ["--trust-remote-code"]},
    ),
    "DSV4-R014": (
        {"engine.reasoningParser": "deepseek-r1"},
        {"engine.reasoningParser": "deepseek-v4"},
    ),
    "DSV4-R015": (
        {"engine.extraArgs": ["--chat-template", "/t.jinja"]},
        {
            **V32,
            "gpu.product": "NVIDIA-B200",
            "prefill.tensorParallel": 8,
            "decode.tensorParallel": 8,
            "engine.extraArgs": ["--chat-template", "/t.jinja"],
        },
    ),
    "DSV4-R016": ({"engine.kvCacheDtype": "fp8_e5m2"}, {"engine.kvCacheDtype": "fp8_e4m3"}),
    "DSV4-R017": (
        {
            "engine.hicache": {"enabled": True},
            "engine.extraArgs": EAGLE,
        },
        {"engine.extraArgs": EAGLE},
    ),
    "DSV4-R018": (
        {"engine.extraArgs": ["--enable-mixed-chunks"]},
        {"engine.extraArgs": ["--enable-mixed-chunk"]},
    ),
    "DSV4-R019": (
        {"engine.env": [{"name": "SGLANG_DSV4_COMPRES_STATE_DTYPE", "value": "bf16"}]},
        {"engine.env": [{"name": "SGLANG_DSV4_COMPRESS_STATE_DTYPE", "value": "bf16"}]},
    ),
    "DSV4-R021": (
        {"engine.extraArgs": ["--speculative-algorithm", "EAGLE"]},
        {"engine.extraArgs": EAGLE},
    ),
    "DSV4-R020": (
        {"engine.extraArgs": ["--enable-hisparse"]},
        {"engine.extraArgs": ["--enable-mixed-chunk"]},
    ),
    # HiSparse PD page indices (#31482) are fixed in 0.5.23 (PR #31901): the rule is 0.5.16's
    "DSV4-R022": (
        {"decode.overrides": {"extraArgs": ["--enable-hisparse"]}},
        {**V0523, "decode.overrides": {"extraArgs": ["--enable-hisparse"]}},
    ),
    "DSV4-R023": ({"transfer.kvChecksum": True}, {**V0523, "transfer.kvChecksum": True}),
    "DSV4-R024": (
        {**V0523, "engine.env": [{"name": "SGLANG_DSV4_KV_LAYOUT", "value": "v41"}]},
        {
            **V0523,
            "gpu.product": "NVIDIA-B200",
            "engine.env": [{"name": "SGLANG_DSV4_KV_LAYOUT", "value": "v41"}],
        },
    ),
    # multi-node parallelism (engine/rules/multinode.py); both sides on the example's TP4
    "DSV4-R025": (
        {"decode.attentionDataParallel": 3},
        {"decode.attentionDataParallel": 4, "decode.expertParallel": 2},
    ),
    "DSV4-R026": (
        {"decode.expertParallel": 2, "decode.moeAllToAll": "deepep"},
        {"decode.expertParallel": 4, "decode.moeAllToAll": "deepep"},
    ),
    "DSV4-R027": (
        {"decode.expertParallel": 4, "decode.overrides": {"extraArgs": ["--ep", "4"]}},
        {"decode.expertParallel": 4},
    ),
    "DSV4-R028": (
        {"engine.memFractionStatic": 0.95},
        {"engine.memFractionStatic": 0.89},
    ),
}


def _rules(spec: dict[str, Any]) -> set[str]:
    return {f.rule for f in validate_spec(spec).findings}


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def test_every_rule_has_both_sides_tested() -> None:
    assert set(CASES) == {r.id for r in CATALOGUE}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires(rule_id: str, variant: Callable[..., dict[str, Any]]) -> None:
    assert rule_id in _rules(variant(_clean(CASES[rule_id][0])))


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_quiet_outside_condition(rule_id: str, variant: Callable[..., dict[str, Any]]) -> None:
    assert rule_id not in _rules(variant(_clean(CASES[rule_id][1])))


def test_example_has_no_findings(variant: Callable[..., dict[str, Any]]) -> None:
    result = validate_spec(variant({}))
    assert result.valid and result.findings == []


def test_catalogue_entries_are_complete() -> None:
    for rule in CATALOGUE:
        assert rule.id.startswith("DSV4-R") and len(rule.id) == 9
        assert rule.reference and rule.title and rule.reads
    assert {r.id for r in CATALOGUE if not r.acknowledgeable} >= {
        "DSV4-R007",
        "DSV4-R008",
        "DSV4-R011",
    }


def _finding(spec: dict[str, Any], rule_id: str) -> Any:
    return next(f for f in validate_spec(spec).findings if f.rule == rule_id)


def test_enforce_rejects_unless_acknowledged(variant: Callable[..., dict[str, Any]]) -> None:
    trigger = CASES["DSV4-R001"][0]
    assert _finding(variant(trigger), "DSV4-R001").severity == "error"
    acked = _finding(variant({**trigger, "safety.acknowledge": ["DSV4-R001"]}), "DSV4-R001")
    assert acked.severity == "warning" and "acknowledged" in acked.message
    assert validate_spec(variant({**trigger, "safety.acknowledge": ["DSV4-R001"]})).valid


def test_warn_policy_records_errors_as_warnings(variant: Callable[..., dict[str, Any]]) -> None:
    result = validate_spec(variant({**CASES["DSV4-R002"][0], "safety.policy": "Warn"}))
    assert result.valid
    assert (
        _finding(variant({**CASES["DSV4-R002"][0], "safety.policy": "Warn"}), "DSV4-R002").severity
        == "warning"
    )


@pytest.mark.parametrize("rule_id", ["DSV4-R007", "DSV4-R008", "DSV4-R011", "DSV4-R013"])
def test_never_acknowledgeable_rules_stay_errors(
    rule_id: str, variant: Callable[..., dict[str, Any]]
) -> None:
    assert not RULES_BY_ID[rule_id].acknowledgeable
    spec = variant(
        {**_clean(CASES[rule_id][0]), "safety.policy": "Warn", "safety.acknowledge": [rule_id]}
    )
    result = validate_spec(spec)
    assert not result.valid
    assert _finding(spec, rule_id).severity == "error"


def test_owned_env_names_the_field_to_use(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant(
        {
            "engine.env": [{"name": "SGLANG_DSV4_BF16_INDEX_K", "value": "1"}],
            "decode.overrides": {
                "env": [{"name": "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP", "value": "1"}]
            },
        }
    )
    messages = {f.field: f.message for f in validate_spec(spec).findings if f.rule == "DSV4-R013"}
    assert "spec.engine.indexKDtype" in messages["spec.engine.env"]
    assert "spec.engine.overlap.multiStream" in messages["spec.decode.overrides.env"]


def test_transfer_format_override_is_refused_as_r011(
    variant: Callable[..., dict[str, Any]],
) -> None:
    result = validate_spec(variant({"decode.overrides": {"indexKDtype": "bf16"}}))
    [finding] = result.findings
    assert finding.rule == "DSV4-R011" and finding.field == "spec.decode.overrides.indexKDtype"
    assert "spec.engine.indexKDtype" in finding.message


def test_schema_errors_carry_field_paths(variant: Callable[..., dict[str, Any]]) -> None:
    result = validate_spec(
        variant({"engine.indexKDtype": "int8", "engine.cudaGraphMaxBs": "many", "router.bogus": 1})
    )
    fields = {f.field for f in result.findings if f.rule == "schema"}
    assert fields == {"spec.engine.indexKDtype", "spec.engine.cudaGraphMaxBs", "spec.router.bogus"}


def test_cel_mirrors_are_reported(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant(
        {
            "workload.contextTokens": 200000,
            "transfer.bootstrapPort": 30000,
            "model.cache": {"pvc": {"claimName": "a"}, "hostPath": {"path": "/m"}},
        }
    )
    fields = {f.field for f in validate_spec(spec).findings if f.rule == "schema"}
    assert fields == {
        "spec.workload.contextTokens",
        "spec.transfer.bootstrapPort",
        "spec.model.cache",
    }


@pytest.mark.parametrize(
    "args",
    [
        ["--max-total-tok", "1"],
        ["--max-total-tokens=1"],
        ["--mem-fraction", "0.99"],
        ["--kv-cache-dt", "bfloat16"],
        ["--kv-cache-dt=bfloat16"],
        ["--model", "other/model"],
        ["--tensor-parallel-size", "8"],
        ["--disable-overlap"],
    ],
)
def test_owned_flags_are_refused_in_every_spelling_the_parser_accepts(
    args: list[str], variant: Callable[..., dict[str, Any]]
) -> None:
    for version in ("0.5.16", "0.5.23"):
        spec = variant(
            {"engine.sglangVersion": version, "engine.capabilities": [], "engine.extraArgs": args}
        )
        hits = [f for f in validate_spec(spec).findings if f.rule == "DSV4-R013"]
        assert hits, (version, args)
        assert "resolves to --" in hits[0].message and "use " in hits[0].message


def test_unknown_flag_names_the_closest_real_flag(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant({"engine.extraArgs": ["--enable-mixed-chunks"]})
    [hit] = [f for f in validate_spec(spec).findings if f.rule == "DSV4-R018"]
    assert "--enable-mixed-chunk" in hit.message and "0.5.16" in hit.message


def test_ambiguous_abbreviation_is_refused(variant: Callable[..., dict[str, Any]]) -> None:
    spec = variant({**V0523, "engine.extraArgs": ["--cuda-graph-max-bs", "8"]})
    hits = [f for f in validate_spec(spec).findings if f.rule in ("DSV4-R013", "DSV4-R018")]
    assert hits and all(f.severity == "error" for f in hits)


def test_no_spelling_of_an_owned_flag_is_accepted(variant: Callable[..., dict[str, Any]]) -> None:
    spellings = spellings_of_owned_flags()
    assert len(spellings) > 500
    base = variant({})
    accepted = []
    for version, token in spellings:
        spec = copy.deepcopy(base)
        spec["engine"].update(sglangVersion=version, capabilities=[], extraArgs=[token, "1"])
        findings = validate_spec(spec).findings
        if not any(
            f.rule in ("DSV4-R013", "DSV4-R018") and f.severity == "error" for f in findings
        ):
            accepted.append((version, token))
    assert accepted == []

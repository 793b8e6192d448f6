"""bisect/delta.py: the units between two specs, normalised through the release's knowledge,
paired settings as one unit on both roles, and the probe spec of any subset."""

from __future__ import annotations

from typing import Any

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.bisect import search
from dsv4_operator.bisect.delta import compute_delta, fingerprint
from dsv4_operator.bisect.outcome import Outcome
from dsv4_operator.engine.effective import effective_role
from dsv4_operator.engine.validation import validate_spec
from tests.support.builders import Doc, example_doc, with_changes

NEW_IMAGE = "registry.example.com/dsv4-engine:0.5.16-p4"


def good() -> Doc:
    spec: Doc = example_doc()["spec"]
    return spec


def incident() -> Doc:
    """The incident's kind of delta: bf16 index-K, HiCache, multi-stream overlap, a flag."""
    return with_changes(
        good(),
        {
            "engine.indexKDtype": "bf16",
            "engine.hicache.enabled": True,
            "engine.overlap.multiStream": True,
            "engine.extraArgs": ["--chunked-prefill-size", "4096"],
            "safety.acknowledge": ["DSV4-R001", "DSV4-R002"],
        },
    )


def gated_image() -> Doc:
    """bf16 index-K with HiCache on a new image that declares the HiCache gate: sound as a
    whole, while the two settings without the image are DSV4-R001."""
    return with_changes(
        good(),
        {
            "engine.image": NEW_IMAGE,
            "engine.capabilities": ["bf16IndexK", "poolSizingFix", "indexKHiCacheGate"],
            "engine.indexKDtype": "bf16",
            "engine.hicache.enabled": True,
        },
    )


def test_the_incident_delta_is_one_unit_per_setting_with_names_and_values() -> None:
    delta = compute_delta(good(), incident())
    assert [(u.id, u.name, u.good, u.bad) for u in delta.units] == [
        ("engine.indexKDtype", "spec.engine.indexKDtype", "fp8", "bf16"),
        ("engine.hicache.enabled", "spec.engine.hicache.enabled", "false", "true"),
        ("engine.overlap.multiStream", "spec.engine.overlap.multiStream", "false", "true"),
        (
            "engine.extraArgs:--chunked-prefill-size",
            "--chunked-prefill-size",
            None,
            "4096",
        ),
    ]


def test_aliases_prefixes_eq_forms_and_defaults_are_no_change() -> None:
    """Each pair below runs the same engines; none of it is a unit."""
    base = with_changes(
        good(), {"engine.extraArgs": ["--chunked-prefill-size", "4096", "--moe-dp-size", "2"]}
    )
    respelled = with_changes(
        good(),
        {
            # The `=` form of an unambiguous prefix, and an alias, of the same flags.
            "engine.extraArgs": ["--chunked-prefill-siz=4096", "--moe-data-parallel-size", "2"],
            "engine.cudaGraphMaxBs": 64,  # the default, written out
            "engine.hicache": {"enabled": False, "writePolicy": "write_through"},
            "prefill.replicas": 3,  # not an engine setting
            "guard.canary.rounds": 7,
        },
    )
    del respelled["engine"]["memFractionStatic"]  # 0.85 is its default
    assert compute_delta(base, respelled).units == ()


def test_a_setting_that_changes_no_engine_is_no_change() -> None:
    """hicache.ratio with HiCache off on both sides reaches no engine."""
    delta = compute_delta(good(), with_changes(good(), {"engine.hicache.ratio": 4.0}))
    assert delta.units == ()
    with_hicache = with_changes(good(), {"engine.hicache.enabled": True})
    delta = compute_delta(with_hicache, with_changes(with_hicache, {"engine.hicache.ratio": 4.0}))
    assert [u.id for u in delta.units] == ["engine.hicache.ratio"]


def test_paired_settings_move_together_on_prefill_and_decode() -> None:
    """--attention-backend is in the release's pairing set: set per role in the rejected
    spec, it is one unit, and applying it changes both roles (never one alone)."""
    flags = ["--attention-backend", "flashmla"]
    bad = with_changes(
        good(),
        {
            "prefill.overrides.extraArgs": flags,
            "decode.overrides.extraArgs": flags,
            "decode.overrides.env": [{"name": "SGLANG_SOME_KNOB", "value": "1"}],
        },
    )
    delta = compute_delta(good(), bad)
    ids = [u.id for u in delta.units]
    assert ids == ["paired:attentionBackend", "decode.overrides.env:SGLANG_SOME_KNOB"]
    paired = delta.unit(ids[0])
    assert paired.name == "--attention-backend (decode, prefill)"
    assert {e.path for e in paired.edits} == {
        "prefill.overrides.extraArgs",
        "decode.overrides.extraArgs",
    }
    probe = DSV4DeploymentSpec.model_validate(delta.spec_for([ids[0]]))
    for role in ("prefill", "decode"):
        assert effective_role(probe, role).flags["--attention-backend"][1] == "flashmla"
    assert delta.refusal([ids[0]]) is None
    assert delta.unit(ids[1]).name == "SGLANG_SOME_KNOB (decode)"


def test_role_overrides_are_units_of_their_own() -> None:
    bad = with_changes(good(), {"decode.overrides.cudaGraphMaxBs": 32})
    delta = compute_delta(good(), bad)
    assert [(u.id, u.good, u.bad) for u in delta.units] == [
        ("decode.overrides.cudaGraphMaxBs", None, "32")
    ]


def test_the_full_delta_runs_what_the_rejected_spec_runs_and_none_runs_the_good() -> None:
    bad = incident()
    delta = compute_delta(good(), bad)
    assert fingerprint(delta.spec_for(delta.unit_ids)) == fingerprint(bad)
    assert fingerprint(delta.spec_for([])) == fingerprint(good())
    probe = delta.spec_for(["engine.overlap.multiStream"])
    assert probe["engine"]["overlap"]["multiStream"] is True
    assert probe["engine"]["indexKDtype"] == "fp8"


def test_a_subset_the_rules_refuse_is_reported_with_the_rule() -> None:
    """bf16 index-K with HiCache needs the gate the new image declares (DSV4-R001): without
    the image unit the pair is refused, with it the probe may start."""
    bad = gated_image()
    assert validate_spec(bad).valid
    delta = compute_delta(good(), bad)
    assert delta.unit_ids == ["engine.image", "engine.indexKDtype", "engine.hicache.enabled"]
    why = delta.refusal(["engine.indexKDtype", "engine.hicache.enabled"])
    assert why is not None and "DSV4-R001" in why
    assert delta.refusal(delta.unit_ids) is None
    assert delta.refusal(["engine.indexKDtype"]) is None


def test_a_bad_spec_names_the_field() -> None:
    bad: dict[str, Any] = with_changes(good(), {"engine.indexKDtype": "int3"})
    try:
        compute_delta(good(), bad)
    except ValueError as error:
        assert "spec.engine.indexKDtype" in str(error)
    else:
        raise AssertionError("an invalid spec must be refused")


def test_the_negative_form_of_a_boolean_flag_is_a_change() -> None:
    """--no-x shares --x's destination in argparse (BooleanOptionalAction) but means off."""
    on = with_changes(good(), {"engine.extraArgs": ["--dllm-fdfo"]})
    off = with_changes(good(), {"engine.extraArgs": ["--no-dllm-fdfo"]})
    delta = compute_delta(on, off)
    assert [(u.id, u.good, u.bad) for u in delta.units] == [
        ("engine.extraArgs:--dllm-fdfo", "on", "off")
    ]


def test_the_search_never_starts_a_subset_the_rules_refuse() -> None:
    """The real rules through the real search: bf16 index-K + HiCache without the new image's
    gate is DSV4-R001, so that pair is recorded refused and never probed; the answer says the
    culprit it names may not be minimal."""
    delta = compute_delta(good(), gated_image())
    refused_pair = frozenset({"engine.indexKDtype", "engine.hicache.enabled"})
    probed: list[frozenset[str]] = []
    state = search.start(delta.unit_ids, budget=30)
    while search.answer(state) is None:
        state, probes = search.next_probes(state, 2, delta.refusal)
        for probe in probes:
            applied = frozenset(probe.units)
            probed.append(applied)
            leaks = refused_pair <= applied  # the double's race, whatever the image
            state = search.record(state, probe.probe_id, Outcome.FAIL if leaks else Outcome.PASS)
    assert refused_pair not in probed
    refused = [p for p in state.probes if p.status is search.ProbeStatus.REFUSED]
    assert [frozenset(p.units) for p in refused] == [refused_pair]
    assert "DSV4-R001" in refused[0].reason
    found = search.answer(state)
    assert found is not None and found.reason is search.Reason.FOUND
    assert sorted(found.culprit) == sorted(delta.unit_ids) and not found.minimal

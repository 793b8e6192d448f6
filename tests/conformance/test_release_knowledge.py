"""What the operator knows of each release, checked against that release's own code: the
settings it pairs between prefill and decode, the rules' introducedIn / fixedIn, how its parser
resolves a passthrough token, and the KV layouts the planner plans with.

For each supported release (its wheels, CPU-only): the fields of the PD bootstrap handshake are
exactly the ones the release's pairing list names (plus the topology the roles may differ in);
every source line the pairing list and the rule catalogue cite is in the release from the
version they name on and absent before; every prefix of every flag resolves as the release's
argparse resolves it, and every invalid choice is refused as it refuses it; the KV-layout
settings give the pool bytes and the PD layout string of the release's own
`DSV4PoolConfigurator` and pool, and the settings DSV4-R024 refuses are the ones it refuses; the
canary lets go of an idle connection well before the release's HTTP server does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dsv4_operator.api.roles import ROLES, Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.canary.transport import KEEPALIVE_S
from dsv4_operator.engine.effective import effective_role
from dsv4_operator.engine.planner import role_layouts
from dsv4_operator.engine.releases import release, version_key
from dsv4_operator.engine.rules import CATALOGUE
from dsv4_operator.engine.rules.passthrough import _invalid_choice

from .matrix import Case, layout_cases
from .release_env import MODEL_DIR

pytestmark = pytest.mark.conformance

Ask = Callable[[str, dict[str, Any]], dict[str, Any]]

# Handshake fields that describe each side's topology or the rank mapping, which prefill and
# decode may legitimately differ in (the transfer re-slices across TP/CP/PP and DP ranks).
TOPOLOGY = {
    "attn_tp_size",
    "attn_cp_size",
    "dp_size",
    "pp_size",
    "follow_bootstrap_room",
    "enable_dsa_cache_layer_split",  # DSA (V3.2) only: how prefill splits its cache layers
    "enable_kv_cache_sharding",  # prefill-side sharding of the pages it sends
    "prefill_http_port",
    "target_tp_rank",
    "target_tp_ranks",
    "target_cp_ranks",
    "target_pp_ranks",
    "required_dst_info_num",
    "required_prefill_response_num",
}
# How the launch gives uvicorn the engine's keep-alive (srt/entrypoints/http_server.py).
HANDS_KEEP_ALIVE_TO_UVICORN = "timeout_keep_alive=envs.SGLANG_TIMEOUT_KEEP_ALIVE.get()"
C4_C128 = (0, 4, 128)  # DeepSeek-V4-Flash's compress ratios (tests/conformance/data)


def test_handshake_fields_are_the_pairing_lists(version: str, asker: Ask) -> None:
    fields = set(asker(version, {"handshake": True})["handshake"])
    engine_release = release(version)
    assert engine_release is not None
    paired = {p.handshake for p in engine_release.pairing if p.handshake}
    assert fields - TOPOLOGY == paired, (
        f"sglang {version}'s PrefillServerInfo compares {sorted(fields - TOPOLOGY)}; the "
        f"pairing list in engine/data/releases.yaml names {sorted(paired)}"
    )


def test_every_cited_source_line_is_where_its_version_says(version: str, asker: Ask) -> None:
    engine_release = release(version)
    assert engine_release is not None
    # (what cites it, file, text, whether this release must have it)
    cited: list[tuple[str, str, str, bool]] = [
        (f"pairing {p.setting}", p.proof.file, p.proof.text, True)
        for p in engine_release.pairing
        if p.proof is not None
    ]
    for rule in CATALOGUE:
        for change in rule.changes():
            if change.proof is not None:
                present = version_key(version) >= version_key(change.version)
                cited.append((rule.id, change.proof.file, change.proof.text, present))
    answer = asker(version, {"sources": [{"file": f, "text": t} for _, f, t, _ in cited]})
    wrong = [
        (who, file, text, "expected" if want else "not expected")
        for (who, file, text, want), found in zip(cited, answer["sources"], strict=True)
        if found != want
    ]
    assert not wrong, f"sglang {version}: {wrong}"


def test_the_canary_lets_go_of_an_idle_connection_before_the_engine(
    version: str, asker: Ask
) -> None:
    """A POST sent on a kept connection as the server closes it fails once sent and is not
    retried: the canary's keep-alive must end first, with room for the request's way there."""
    launch = {"file": "srt/entrypoints/http_server.py", "text": HANDS_KEEP_ALIVE_TO_UVICORN}
    answer = asker(version, {"keepAlive": True, "sources": [launch]})
    assert answer["sources"] == [True], (
        f"sglang {version}'s launch: no {HANDS_KEEP_ALIVE_TO_UVICORN}"
    )
    seconds = answer["keepAlive"]
    assert seconds >= KEEPALIVE_S + 1.0, (
        f"the canary keeps idle connections {KEEPALIVE_S:g} s, sglang {version}'s HTTP server "
        f"{seconds} s (SGLANG_TIMEOUT_KEEP_ALIVE): lower canary/transport.py KEEPALIVE_S"
    )


def _our_resolution(version: str, token: str) -> str:
    engine_release = release(version)
    assert engine_release is not None
    resolution = engine_release.engine.resolve(token)
    if resolution.unknown:
        return "unknown"
    if resolution.ambiguous:
        return "ambiguous"
    return resolution.options[0].dest


def test_every_prefix_resolves_as_the_release_parser_resolves_it(version: str, asker: Ask) -> None:
    engine_release = release(version)
    assert engine_release is not None
    tokens = sorted(
        {flag[:end] for flag in engine_release.engine.flags for end in range(3, len(flag) + 1)}
        | {f"{flag}=1" for flag in engine_release.engine.flags}
        | {"--page-si", "--page-si=1", "--disaggregation-enable-kv", "--no-such-flag", "--d"}
    )
    theirs = asker(version, {"resolve": tokens})["resolve"]
    differ = {t: (_our_resolution(version, t), theirs[t]) for t in tokens}
    differ = {t: v for t, v in differ.items() if v[0] != v[1]}
    assert len(tokens) > 5000
    assert not differ, f"{len(differ)} of {len(tokens)} tokens differ (ours, theirs): {differ}"
    assert theirs["--page-si"] == "page_size"


def test_choices_are_refused_as_the_release_parser_refuses_them(version: str, asker: Ask) -> None:
    engine_release = release(version)
    assert engine_release is not None
    pairs: list[list[str]] = []
    for option in engine_release.engine.options:
        if option.choices is None or not option.takes_value:
            continue
        flag = option.flags[0]
        pairs += [[flag, choice] for choice in option.choices]
        pairs.append([flag, "not-a-choice"])
    theirs = asker(version, {"values": pairs})["values"]
    ours = [
        _invalid_choice(engine_release.engine.resolve(flag).options[0], (flag, value), 0)
        is not None
        for flag, value in pairs
    ]
    differ = [(p, o, t) for p, o, t in zip(pairs, ours, theirs, strict=True) if o != t]
    assert len(pairs) > 50
    assert not differ, f"(argv, we refuse, it refuses): {differ}"


@pytest.fixture(scope="module")
def layouts() -> dict[str, list[tuple[Case, list[str]]]]:
    from .release_env import RELEASES

    return {version: layout_cases(version) for version in RELEASES}


def _arch(case: Case) -> str:
    gpu = case.plan.profiles.gpu
    assert gpu is not None, case.id
    return gpu.compute_capability


def _request(case: Case, role: Role) -> dict[str, Any]:
    argv = case.engine_argv(role)
    argv[argv.index("--model-path") + 1] = str(MODEL_DIR)
    return {
        "argv": argv,
        "env": dict(case.launches[role].env),
        "modelDir": str(MODEL_DIR),
        "availableBytes": case.plan.roles[role].available_bytes,
        "gpuArch": _arch(case),
        "kvLayout": True,
    }


def _pd_layout(case: Case, role: Role) -> str | None:
    """The PD layout string the planner's layouts make (None: the release has one layout)."""
    if case.plan.profiles.release.pool_arithmetic.value != "dsv4-paged":
        return None
    eff = effective_role(DSV4DeploymentSpec.model_validate(case.spec), role)
    return role_layouts(eff, case.plan.profiles).pd_layout(C4_C128)


def test_kv_layouts_are_the_release_configurators_to_the_byte(
    layouts: dict[str, list[tuple[Case, list[str]]]], version: str, asker: Ask
) -> None:
    request: dict[str, Any] = {"pools": {}}
    expected: dict[str, dict[str, Any]] = {}
    for case, refused_by in layouts[version]:
        for role in ROLES:
            key = f"{case.id}/{role}"
            request["pools"][key] = _request(case, role)
            if "DSV4-R024" in refused_by:
                expected[key] = {"ok": False}
                continue
            plan = case.plan.roles[role]
            sizing = plan.engine_sizing  # what an unpatched configurator reserves
            expected[key] = {
                "ok": True,
                "bytesPerFullToken": sizing.bytes_per_full_token,
                "full": sizing.full_tokens(plan.available_bytes, 256),
                "kvLayout": _pd_layout(case, role),
            }
    answer = asker(version, request)["pools"]
    differ = {}
    for key, want in expected.items():
        got = answer[key]
        seen = {k: got.get(k) for k in want}
        if seen != want:
            differ[key] = (seen, want, got.get("error"))
    assert not differ, f"{len(differ)} of {len(expected)} differ (theirs, ours, error): {differ}"
    refused = [k for k, v in expected.items() if not v["ok"]]
    if version_key(version) >= version_key("0.5.23"):
        assert refused and len(refused) < len(expected)

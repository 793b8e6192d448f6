"""The engine double answers a corrupted model output as the SGLang release it runs as parses it:
0.5.16's DeepSeekV4Detector leaks the DSML of a section it fails on into `content` and drops a
section that never closes; 0.5.23's deepseek-recipe returns what it can read as calls, broken
arguments and all, and drops silently only what it cannot read, as many of the corruptions as
`DSV4_DOUBLE_SILENT_DROP_SHARE` says. Log lines and, with toolCallDropCounter, counters as the
release (tests/conformance/test_engine_double.py checks the answers against the wheels). Also
the KV checksum and `/server_info` knobs. Pure: configs, answers and a registry, no process.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from dsv4_engine_double import outputs, parsers, shapes
from dsv4_engine_double.config import DEFAULT_MAX_TOTAL_TOKENS, DoubleConfig, parse_config
from dsv4_engine_double.examples import BF16_HICACHE, conversation, rendered
from dsv4_engine_double.expectations import answer_corruption_probability, binomial_band
from dsv4_engine_double.metrics import Metrics
from dsv4_engine_double.outputs import Generated
from dsv4_engine_double.server import Answer, answer, conversation_rng
from dsv4_operator.canary.scenario import CANARY_TOOLS
from dsv4_operator.leak.classifier import classify_response

LOAD = 60
CAPS = "bf16IndexK,toolCallDropCounter"
SILENT = {"unterminated_section", "malformed", "unclosed"}


def _config(version: str, **env: str) -> DoubleConfig:
    args, rendered_env = rendered(BF16_HICACHE)
    return parse_config(
        args,
        {
            **rendered_env,
            "DSV4_DOUBLE_CAPABILITIES": CAPS,
            "DSV4_DOUBLE_SGLANG_VERSION": version,
            **env,
        },
    )


def _answers(config: DoubleConfig, count: int = 2000) -> list[Answer]:
    bodies = [conversation(i) for i in range(count)]
    return [answer(config, b, conversation_rng(config.seed, b), LOAD, 10) for b in bodies]


def _corrupted(config: DoubleConfig, count: int = 2000) -> list[Answer]:
    """The answers to the conversations whose model output was corrupted."""
    return [a for a in _answers(config, count) if a.output is not None]


def _message(a: Answer) -> dict[str, Any]:
    message: dict[str, Any] = a.response["choices"][0]["message"]
    return message


def _finish(a: Answer) -> str:
    finish: str = a.response["choices"][0]["finish_reason"]
    return finish


# --- configuration ----------------------------------------------------------------------------


def test_the_release_comes_from_the_rendered_statefulset() -> None:
    _, env = rendered({"engine.sglangVersion": "0.5.23"})
    assert env["DSV4_DOUBLE_SGLANG_VERSION"] == "0.5.23"
    assert parse_config([], env).parses_with_recipe
    _, env = rendered({})  # the example: 0.5.16
    assert env["DSV4_DOUBLE_SGLANG_VERSION"] == "0.5.16"
    assert not parse_config([], env).parses_with_recipe


def test_release_knobs_parse_and_refuse_nonsense() -> None:
    default = parse_config([], {})
    assert default.sglang_version == "0.5.16" and not default.parses_with_recipe
    assert default.silent_drop_share == 0.0 and default.kv_checksum_mismatch_prob == 0.0
    config = parse_config(
        ["--disaggregation-enable-kv-checksum", "--tool-call-parser", "deepseekv4"],
        {
            "DSV4_DOUBLE_SGLANG_VERSION": "0.5.23",
            "DSV4_DOUBLE_SILENT_DROP_SHARE": "1",
            "DSV4_DOUBLE_KV_CHECKSUM_MISMATCH_PROB": "0.2",
            "DSV4_DOUBLE_CAPABILITIES": "toolCallDropCounter",
        },
    )
    assert config.parses_with_recipe and config.kv_checksum and config.counts_tool_call_drops
    assert config.silent_drop_share == 1.0 and config.kv_checksum_mismatch_prob == 0.2
    assert "--disaggregation-enable-kv-checksum" not in config.unknown_args
    # 0.5.16 has no checksum flag; no DSML parser or no patch: nothing counted
    assert not dataclasses.replace(config, sglang_version="0.5.16").kv_checksum
    assert not dataclasses.replace(config, tool_call_parser="qwen25").counts_tool_call_drops
    assert not dataclasses.replace(config, capabilities=frozenset()).counts_tool_call_drops
    assert parse_config([], {"DSV4_DOUBLE_SGLANG_VERSION": "0.5.23.post1"}).parses_with_recipe
    for env in (
        {"DSV4_DOUBLE_SGLANG_VERSION": "latest"},
        {"DSV4_DOUBLE_SGLANG_VERSION": "0.5.21"},  # a release whose parsers are not modelled
        {"DSV4_DOUBLE_SILENT_DROP_SHARE": "1.5"},
        {"DSV4_DOUBLE_KV_CHECKSUM_MISMATCH_PROB": "often"},
    ):
        with pytest.raises(SystemExit):
            parse_config([], env)


def test_server_info_reports_the_release_and_the_pool_it_has() -> None:
    planned = parse_config(
        ["--max-total-tokens", "6014720"], {"DSV4_DOUBLE_SGLANG_VERSION": "0.5.23"}
    )
    info = planned.server_info()
    assert info["version"] == "0.5.23"  # SGLang's __version__
    assert info["max_total_num_tokens"] == 6014720
    disagrees = parse_config(
        ["--max-total-tokens", "6014720"], {"DSV4_DOUBLE_REPORTED_MAX_TOTAL_TOKENS": "5000000"}
    )
    assert disagrees.server_info()["max_total_num_tokens"] == 5000000
    assert parse_config([], {}).server_info()["max_total_num_tokens"] == DEFAULT_MAX_TOTAL_TOKENS
    registry = Metrics(disagrees).registry
    assert registry.get_sample_value("sglang:max_total_num_tokens", _sched(disagrees)) == 5000000


def _sched(config: DoubleConfig) -> dict[str, str]:
    return {"model_name": config.name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}


# --- answers per release ------------------------------------------------------------------------


def test_both_releases_read_the_same_corrupted_outputs_and_answer_them_their_own_way() -> None:
    old, new = _corrupted(_config("0.5.16")), _corrupted(_config("0.5.23"))
    assert len(old) > 40
    # the corruption draw and what the model generated do not depend on the release
    assert [a.output for a in old] == [a.output for a in new]
    by_kind = Counter(a.output.kind for a in old if a.output)
    assert by_kind.keys() == outputs.HICACHE_OUTPUTS.keys()  # bf16 + HiCache's outputs
    for before, after in zip(old, new, strict=True):
        assert before.output is not None
        kind = before.output.kind
        assert before.shape is not None  # 0.5.16 never answers a corrupted output cleanly
        if kind is Generated.BROKEN_JSON_BODY:  # the incident's leak, an empty call on 0.5.23
            assert "<｜DSML｜tool_calls>" in _message(before)["content"]
            assert after.shape is shapes.Shape.EMPTY_ARGS
            assert [c["function"]["arguments"] for c in _message(after)["tool_calls"]] == ["{}"]
        if kind in (Generated.BARE_INVOKE, Generated.V32_SECTION):  # no V4 section: content
            assert _message(before)["content"].startswith("<｜DSML｜")
        if kind in (Generated.UNCLOSED_SECTION, Generated.CUT_IN_VALUE):  # never closes: dropped
            assert before.shape is shapes.Shape.DROPPED
            assert _message(before)["content"] in shapes.PREAMBLES
        if kind in (Generated.BARE_INVOKE, Generated.V32_SECTION, Generated.UNCLOSED_SECTION):
            assert after.shape is None and _finish(after) == "tool_calls"  # recipe reads them
            verdict = classify_response(after.response, tools=CANARY_TOOLS, must_call=True)
            assert verdict.kind.value == "ok"
        if kind is Generated.CUT_IN_VALUE:  # recipe returns what it read, cut off
            (call,) = _message(after)["tool_calls"]
            assert call["function"]["name"] == before.tool
            with pytest.raises(ValueError):
                json.loads(call["function"]["arguments"])


def _each_output(config: DoubleConfig) -> Iterator[tuple[Generated, parsers.Parsed]]:
    """Every output kind the double can draw, a dozen times each, answered as `config`."""
    for kind in Generated:
        for seed in range(12):
            rng = random.Random(f"{kind}:{seed}")
            call = shapes.make_call(CANARY_TOOLS, rng.choice(shapes.tool_names(CANARY_TOOLS)), rng)
            output = outputs.generate(kind, CANARY_TOOLS, call, rng)
            yield kind, parsers.parse(config, output, CANARY_TOOLS)


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_each_answer_gets_its_shapes_verdict(version: str) -> None:
    """The detector's verdict on each answer is the answer shape's (ok for a well-formed one)."""
    rng = random.Random(0)
    for kind, parsed in _each_output(_config(version)):
        body = shapes.completion(parsers.message(parsed, rng), parsed.finish, model="m", rng=rng)
        verdict = classify_response(body, tools=CANARY_TOOLS, must_call=True)
        expected = "ok" if parsed.shape is None else shapes.EXPECTED_KIND[parsed.shape]
        assert verdict.kind.value == expected, (version, kind, parsed, verdict)


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_the_answer_table_says_which_outputs_each_release_answers_cleanly(version: str) -> None:
    config = _config(version)
    table = parsers.answers(config)
    for kind, parsed in _each_output(config):
        assert (parsed.shape is None) == (table[kind] is None), (kind, parsed)


def test_the_silent_drop_share_drops_every_corruption_silently_on_0_5_23() -> None:
    """DSV4_DOUBLE_SILENT_DROP_SHARE=1: every corrupted tool call is an answer with nothing to
    see on `tool_choice: auto` traffic (HTTP 200, finish_reason stop, no tool_calls, the prose
    only), each counted under the reason the patch gives its output."""
    config = _config("0.5.23", DSV4_DOUBLE_SILENT_DROP_SHARE="1")
    dropped = _corrupted(config, 1000)
    reasons: Counter[str | None] = Counter()
    for a in dropped:
        assert a.output is not None and a.output.kind in outputs.SILENT_DROPS
        assert a.parsed is not None and a.shape is shapes.Shape.DROPPED
        assert _finish(a) == "stop" and _message(a)["tool_calls"] is None
        assert _message(a)["content"] in shapes.PREAMBLES  # no markup
        tap = classify_response(a.response, tools=CANARY_TOOLS, must_call=False)
        assert tap.kind.value == "ok"  # what an observer of auto traffic sees
        reasons[a.parsed.drop_reason] += 1
    assert set(reasons) == SILENT
    # the HiCache plateau: 4.55% of tool calls, all dropped silently
    assert answer_corruption_probability(config, LOAD) == pytest.approx(0.0455)
    low, high = binomial_band(1000, 0.0455)
    assert low <= len(dropped) <= high


@pytest.mark.parametrize(("share", "silent"), [("0", False), ("0.5", True), ("1", True)])
def test_the_silent_drop_share_replaces_the_faults_outputs(share: str, silent: bool) -> None:
    config = _config("0.5.23", DSV4_DOUBLE_SILENT_DROP_SHARE=share)
    kinds = {a.output.kind for a in _corrupted(config) if a.output}
    assert bool(kinds & set(outputs.SILENT_DROPS)) == silent
    assert bool(kinds - set(outputs.SILENT_DROPS)) == (share != "1")


def test_0_5_16_drops_the_section_shapes_and_leaks_the_nameless_invoke() -> None:
    config = _config("0.5.16", DSV4_DOUBLE_SILENT_DROP_SHARE="1")
    for a in _corrupted(config):
        assert a.output is not None and a.parsed is not None
        if a.output.kind is Generated.NAMELESS_INVOKE:
            assert a.shape is shapes.Shape.BARE_INVOKE and a.parsed.drop_reason is None
            assert _message(a)["content"].endswith("\n\n<｜DSML｜invoke")
        else:
            assert a.shape is shapes.Shape.DROPPED
            assert _message(a)["content"] in shapes.PREAMBLES
            assert (
                a.parsed.drop_reason
                == {
                    Generated.OPEN_SECTION: "unterminated_section",
                    Generated.NAMELESS_SECTION: "unclosed",
                }[a.output.kind]
            )


def test_answer_corruption_follows_what_each_release_reads_cleanly() -> None:
    old, new = _config("0.5.16"), _config("0.5.23")
    p = 0.0455  # the HiCache plateau
    assert answer_corruption_probability(old, LOAD) == pytest.approx(p)
    # recipe reads a bare invoke (2), the V3.2 name (1) and an unclosed section (2) of 16
    assert answer_corruption_probability(new, LOAD) == pytest.approx(p * 11 / 16)
    assert answer_corruption_probability(new, 1) == 0.0
    answered = [a for a in _answers(new, 1000) if a.shape is not None]
    low, high = binomial_band(1000, answer_corruption_probability(new, LOAD))
    assert low <= len(answered) <= high


# --- log lines and counters -------------------------------------------------------------------


def _parse(config: DoubleConfig, kind: Generated, seed: int = 0) -> parsers.Parsed:
    rng = random.Random(seed)
    call = ("get_weather", {"location": "Oslo"})
    return parsers.parse(config, outputs.generate(kind, CANARY_TOOLS, call, rng), CANARY_TOOLS)


def test_log_lines_follow_the_release_and_the_patch() -> None:
    new = _config("0.5.23")
    unpatched = dataclasses.replace(new, capabilities=frozenset({"bf16IndexK"}))
    warning = parsers.WARNING
    # recipe logs nothing of its own; the patch names each drop
    for kind in outputs.SILENT_DROPS:
        assert _parse(unpatched, kind).logs == ()
    assert _parse(new, Generated.OPEN_SECTION).logs == ((warning, parsers.UNTERMINATED_WARNING),)
    assert _parse(new, Generated.NAMELESS_INVOKE).logs == (
        (warning, "Dropping unclosed DeepSeek invoke"),
    )
    assert _parse(new, Generated.NAMELESS_SECTION).logs == (
        (warning, "Dropping malformed DeepSeek invoke: 0 call(s) parsed from 1 invoke(s)"),
    )
    assert _parse(new, Generated.BROKEN_JSON_BODY).logs == ()  # `{}`: a call, nothing dropped
    old = _config("0.5.16")
    old_unpatched = dataclasses.replace(old, capabilities=frozenset({"bf16IndexK"}))
    error = (
        parsers.ERROR,
        "Error in detect_and_parse: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)",
    )
    assert _parse(old_unpatched, Generated.BROKEN_JSON_BODY).logs == (error,)
    assert _parse(old, Generated.BROKEN_JSON_BODY).logs == (error,)
    assert _parse(old_unpatched, Generated.UNCLOSED_SECTION).logs == ()  # upstream says nothing
    assert _parse(old, Generated.UNCLOSED_SECTION).logs == (
        (warning, parsers.UNTERMINATED_WARNING),
    )
    unknown = _parse(old_unpatched, Generated.UNKNOWN_TOOL)
    assert unknown.logs == ((warning, "Model attempted to call undefined function: get_weathe"),)
    assert unknown.drop_reason is None and unknown.shape is shapes.Shape.DROPPED


def test_drop_reasons_per_release() -> None:
    new, old = _config("0.5.23"), _config("0.5.16")
    assert _parse(new, Generated.OPEN_SECTION).drop_reason == "unterminated_section"
    assert _parse(new, Generated.NAMELESS_SECTION).drop_reason == "malformed"
    assert _parse(new, Generated.NAMELESS_INVOKE).drop_reason == "unclosed"
    for kind in (Generated.CUT_IN_VALUE, Generated.UNCLOSED_SECTION, Generated.TAG_SOUP):
        assert _parse(new, kind).drop_reason is None  # recipe returns the call, or there is none
    # 0.5.16 counts the exception path that returned the markup, and the unterminated section
    assert _parse(old, Generated.BROKEN_JSON_BODY).drop_reason == "exception"
    assert _parse(old, Generated.CUT_IN_VALUE).drop_reason == "unterminated_section"
    assert _parse(old, Generated.BARE_INVOKE).drop_reason is None
    assert parsers.offers_tools({"tools": CANARY_TOOLS})
    assert not parsers.offers_tools({"tools": CANARY_TOOLS, "tool_choice": "none"})
    assert not parsers.offers_tools({"messages": []})


def test_the_counters_exist_from_zero_and_count_each_response_once() -> None:
    config = _config("0.5.23", DSV4_DOUBLE_SILENT_DROP_SHARE="0.5")
    metrics = Metrics(config)
    r = metrics.registry
    drops = "sglang:dsv4_tool_call_drops_total"
    assert r.get_sample_value("sglang:dsv4_tool_call_responses_total") == 0
    for reason in ("unclosed", "malformed", "unterminated_section", "exception"):
        assert r.get_sample_value(drops, {"reason": reason}) == 0
    reasons = [a.parsed.drop_reason for a in _corrupted(config) if a.parsed]
    for dropped_for in reasons:
        metrics.count_tool_call_response(dropped_for)
    assert r.get_sample_value("sglang:dsv4_tool_call_responses_total") == len(reasons)
    counted = Counter(x for x in reasons if x)
    assert set(counted) == SILENT
    for reason, count in counted.items():
        assert r.get_sample_value(drops, {"reason": reason}) == count
    unpatched = Metrics(dataclasses.replace(config, capabilities=frozenset({"bf16IndexK"})))
    unpatched.count_tool_call_response("unclosed")  # no patch, no family
    assert unpatched.registry.get_sample_value("sglang:dsv4_tool_call_responses_total") is None

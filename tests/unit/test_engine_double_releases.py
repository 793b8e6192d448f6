"""The engine double answers a corrupted tool call as the SGLang release it runs as: 0.5.16 leaks
the DSML into `content`, 0.5.23 drops it (prose only, finish_reason "stop", no tool_calls), with
the release's log lines and, on an image with toolCallDropCounter, its counters. Also the KV
checksum and `/get_server_info` knobs. Pure: configs, answers and a registry, no process."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from dsv4_engine_double import parsers, shapes
from dsv4_engine_double.config import DEFAULT_MAX_TOTAL_TOKENS, DoubleConfig, parse_config
from dsv4_engine_double.examples import BF16_HICACHE, conversation, rendered
from dsv4_engine_double.metrics import Metrics
from dsv4_engine_double.server import Answer, answer, conversation_rng
from dsv4_operator.canary.scenario import CANARY_TOOLS
from dsv4_operator.leak.classifier import classify_response

LOAD = 60
CAPS = "bf16IndexK,toolCallDropCounter"


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


def _corrupted_answers(config: DoubleConfig, count: int = 2000) -> list[Answer]:
    bodies = [conversation(i) for i in range(count)]
    answers = [answer(config, b, conversation_rng(config.seed, b), LOAD, 10) for b in bodies]
    return [a for a in answers if a.shape is not None]


# --- configuration ----------------------------------------------------------------------------


def test_the_release_comes_from_the_rendered_statefulset() -> None:
    _, env = rendered({"engine.sglangVersion": "0.5.23"})
    assert env["DSV4_DOUBLE_SGLANG_VERSION"] == "0.5.23"
    assert parse_config([], env).fails_closed
    _, env = rendered({})  # the example: 0.5.16
    assert env["DSV4_DOUBLE_SGLANG_VERSION"] == "0.5.16"
    assert not parse_config([], env).fails_closed


def test_release_knobs_parse_and_refuse_nonsense() -> None:
    default = parse_config([], {})
    assert default.sglang_version == "0.5.16" and not default.fails_closed
    assert default.unterminated_share == 0.25 and default.kv_checksum_mismatch_prob == 0.0
    config = parse_config(
        ["--disaggregation-enable-kv-checksum", "--tool-call-parser", "deepseekv4"],
        {
            "DSV4_DOUBLE_SGLANG_VERSION": "0.5.23",
            "DSV4_DOUBLE_UNTERMINATED_SHARE": "1",
            "DSV4_DOUBLE_KV_CHECKSUM_MISMATCH_PROB": "0.2",
            "DSV4_DOUBLE_CAPABILITIES": "toolCallDropCounter",
        },
    )
    assert config.fails_closed and config.kv_checksum and config.counts_tool_call_drops
    assert config.unterminated_share == 1.0 and config.kv_checksum_mismatch_prob == 0.2
    assert "--disaggregation-enable-kv-checksum" not in config.unknown_args
    # 0.5.16 has no checksum flag; no DSML parser or no patch: nothing counted
    assert not dataclasses.replace(config, sglang_version="0.5.16").kv_checksum
    assert not dataclasses.replace(config, tool_call_parser="qwen25").counts_tool_call_drops
    assert not dataclasses.replace(config, capabilities=frozenset()).counts_tool_call_drops
    for env in (
        {"DSV4_DOUBLE_SGLANG_VERSION": "latest"},
        {"DSV4_DOUBLE_UNTERMINATED_SHARE": "1.5"},
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


def test_0_5_16_leaks_the_markup_and_0_5_23_drops_it_on_the_same_conversations() -> None:
    old = _corrupted_answers(_config("0.5.16"))
    new = _corrupted_answers(_config("0.5.23"))
    assert len(old) == len(new) > 20  # the corruption draw does not depend on the release
    leaked = [a for a in old if a.shape in parsers.DSML_LEAKS]
    assert leaked and all("｜DSML｜" in _message(a)["content"] for a in leaked)
    assert not any(a.shape in parsers.DROPS for a in old)
    assert not any(a.shape in parsers.DSML_LEAKS for a in new)
    dropped = [a for a in new if a.shape in parsers.DROPS]
    assert len(dropped) == len(leaked)  # each DSML leak of 0.5.16 is a drop in 0.5.23
    for a in dropped:
        message = _message(a)
        assert a.response["choices"][0]["finish_reason"] == "stop"
        assert message["tool_calls"] is None
        assert message["content"] in shapes.PREAMBLES  # the prose before the DSML only
        verdict = classify_response(a.response, tools=CANARY_TOOLS, must_call=True)
        assert verdict.kind.value == "missing_call"


def _message(a: Answer) -> dict[str, Any]:
    message: dict[str, Any] = a.response["choices"][0]["message"]
    return message


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        ("1", {shapes.Shape.DROPPED_UNTERMINATED}),
        ("0", {shapes.Shape.DROPPED_UNCLOSED, shapes.Shape.DROPPED_MALFORMED}),
        (
            "0.5",
            {
                shapes.Shape.DROPPED_UNTERMINATED,
                shapes.Shape.DROPPED_UNCLOSED,
                shapes.Shape.DROPPED_MALFORMED,
            },
        ),
    ],
)
def test_the_unterminated_share_picks_the_drop_shape(
    share: str, expected: set[shapes.Shape]
) -> None:
    config = _config("0.5.23", DSV4_DOUBLE_UNTERMINATED_SHARE=share)
    drops = {a.shape for a in _corrupted_answers(config) if a.shape in parsers.DROPS}
    assert drops == expected


def test_log_lines_follow_the_release_the_patch_and_streaming() -> None:
    new = _config("0.5.23")
    unpatched = dataclasses.replace(new, capabilities=frozenset({"bf16IndexK"}))
    marker = parsers.MARKER_LINE.format(parser="deepseekv4")
    unclosed, malformed, unterminated = (
        shapes.Shape.DROPPED_UNCLOSED,
        shapes.Shape.DROPPED_MALFORMED,
        shapes.Shape.DROPPED_UNTERMINATED,
    )
    assert parsers.log_lines(unpatched, unclosed, "get_weather", stream=False) == [
        "Dropping unclosed DeepSeek invoke 'get_weather'",
        marker,
    ]
    assert parsers.log_lines(unpatched, unclosed, "get_weather", stream=True) == []
    assert parsers.log_lines(new, unclosed, "get_weather", stream=True) == [
        "Dropping unclosed DeepSeek invoke 'get_weather'"
    ]
    assert parsers.log_lines(unpatched, malformed, "x", stream=True) == [
        "Dropping malformed DeepSeek invoke: Malformed DeepSeek tool parameter"
    ]
    # upstream's detector says nothing about an unterminated section; the patch does
    assert parsers.log_lines(unpatched, unterminated, "x", stream=True) == []
    assert parsers.log_lines(unpatched, unterminated, "x", stream=False) == [marker]
    assert parsers.log_lines(new, unterminated, "x", stream=True) == [parsers.UNTERMINATED_WARNING]
    old = _config("0.5.16")
    assert parsers.log_lines(old, shapes.Shape.DSML_BLOCK, "x", stream=False) == []


def test_drop_reasons_per_release() -> None:
    new, old = _config("0.5.23"), _config("0.5.16")
    assert parsers.drop_reason(new, shapes.Shape.DROPPED_UNCLOSED) == "unclosed"
    assert parsers.drop_reason(new, shapes.Shape.DROPPED_MALFORMED) == "malformed"
    assert parsers.drop_reason(new, shapes.Shape.DROPPED_UNTERMINATED) == "unterminated_section"
    assert parsers.drop_reason(new, shapes.Shape.TAG_SOUP) is None
    assert parsers.drop_reason(new, None) is None
    # 0.5.16 returns a section it failed on as content through its exception path
    assert parsers.drop_reason(old, shapes.Shape.DSML_BLOCK) == "exception"
    assert parsers.drop_reason(old, shapes.Shape.UNTERMINATED) == "exception"
    assert parsers.drop_reason(old, shapes.Shape.BARE_INVOKE) is None
    assert parsers.offers_tools({"tools": CANARY_TOOLS})
    assert not parsers.offers_tools({"tools": CANARY_TOOLS, "tool_choice": "none"})
    assert not parsers.offers_tools({"messages": []})


def test_the_counters_exist_from_zero_and_count_each_response_once() -> None:
    config = _config("0.5.23")
    metrics = Metrics(config)
    r = metrics.registry
    drops = "sglang:dsv4_tool_call_drops_total"
    assert r.get_sample_value("sglang:dsv4_tool_call_responses_total") == 0
    for reason in ("unclosed", "malformed", "unterminated_section", "exception"):
        assert r.get_sample_value(drops, {"reason": reason}) == 0
    reasons = [parsers.drop_reason(config, a.shape) for a in _corrupted_answers(config)]
    for reason in reasons:
        metrics.count_tool_call_response(reason)
    assert r.get_sample_value("sglang:dsv4_tool_call_responses_total") == len(reasons)
    for reason, count in Counter(x for x in reasons if x).items():
        assert r.get_sample_value(drops, {"reason": reason}) == count
    unpatched = Metrics(dataclasses.replace(config, capabilities=frozenset({"bf16IndexK"})))
    unpatched.count_tool_call_response("unclosed")  # no patch, no family
    assert unpatched.registry.get_sample_value("sglang:dsv4_tool_call_responses_total") is None

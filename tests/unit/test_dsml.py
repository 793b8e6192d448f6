"""The DSML detector: generated well-formed outputs are ok; every generated leak is flagged."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dsv4_engine_double import shapes
from dsv4_engine_double.corpus import PARAGRAPHS, mixed_responses, normal_prose
from dsv4_operator.canary.scenario import CANARY_TOOLS
from dsv4_operator.leak.classifier import InvalidToolSchema, classify_response
from dsv4_operator.leak.degenerate import degenerate_reason
from dsv4_operator.leak.markup import find_markup
from dsv4_operator.leak.sse import IncompleteStream, StreamError, assemble_stream
from dsv4_operator.leak.verdict import SNIPPET_CHARS, Verdict, VerdictKind

Json = dict[str, Any]

# --- strategies -----------------------------------------------------------------------------

WORDS = [
    "weather",
    "report",
    "region",
    "orders",
    "latency",
    "docs",
    "cache",
    "query",
    "north",
    "south",
    "Paris",
    "Lima",
    "Osaka",
    "service",
    "error",
    "budget",
    "router",
    "decode",
    "prefill",
    "tokens",
    "summary",
    "today",
    "tomorrow",
    "rain",
    "wind",
    "invoice",
    "customer",
    "shipment",
    "index",
    "table",
    "column",
    "value",
    "status",
    "health",
    "rollout",
]
NAME_PARTS = ["get", "run", "list", "find", "city", "days", "unit", "limit", "query", "mode"]
SAFE_NAME = st.builds(
    lambda parts, n: "_".join(parts) + (str(n) if n else ""),
    st.lists(st.sampled_from(NAME_PARTS), min_size=1, max_size=3),
    st.integers(0, 99),
)
PHRASE = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8, unique=True).map(" ".join)
SENTENCE = st.lists(st.sampled_from(WORDS), min_size=3, max_size=9, unique=True).map(
    lambda ws: " ".join(ws).capitalize() + "."
)
PROSE = st.one_of(st.sampled_from(PARAGRAPHS), SENTENCE)


@st.composite
def prop_schemas(draw: st.DrawFn) -> Json:
    kind = draw(st.sampled_from(["string", "integer", "boolean", "enum", "number"]))
    if kind == "enum":
        return {"type": "string", "enum": draw(st.lists(SAFE_NAME, min_size=1, max_size=4))}
    if kind == "integer":
        return {"type": "integer", "minimum": 0, "maximum": 100}
    return {"type": kind}


@st.composite
def toolsets(draw: st.DrawFn) -> list[Json]:
    names = draw(st.lists(SAFE_NAME, min_size=1, max_size=4, unique=True))
    tools = []
    for name in names:
        props = draw(st.dictionaries(SAFE_NAME, prop_schemas(), min_size=1, max_size=4))
        required = draw(st.lists(st.sampled_from(sorted(props)), unique=True, min_size=1))
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "parameters": {
                        "type": "object",
                        "properties": props,
                        "required": required,
                        "additionalProperties": draw(st.booleans()),
                    },
                },
            }
        )
    return tools


def value_for(schema: Json) -> st.SearchStrategy[Any]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    return {
        "string": PHRASE,
        "integer": st.integers(0, 100),
        "number": st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
        "boolean": st.booleans(),
    }[schema["type"]]


@st.composite
def calls_for(draw: st.DrawFn, tools: list[Json]) -> tuple[str, Json]:
    tool = draw(st.sampled_from(tools))["function"]
    params = tool["parameters"]
    args = {}
    for key, schema in params["properties"].items():
        if key in params["required"] or draw(st.booleans()):
            args[key] = draw(value_for(schema))
    return tool["name"], args


def response(message: Json, finish: str | None) -> Json:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "dsv4",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def call_obj(name: str, arguments: str, i: int = 0) -> Json:
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


@st.composite
def well_formed(draw: st.DrawFn) -> tuple[Json, list[Json]]:
    tools = draw(toolsets())
    count = draw(st.integers(1, 2))
    calls = draw(st.lists(calls_for(tools), min_size=count, max_size=count, unique_by=str))
    message: Json = {
        "role": "assistant",
        "content": draw(st.one_of(st.none(), st.just(""), PROSE)),
        "tool_calls": [call_obj(n, json.dumps(a), i) for i, (n, a) in enumerate(calls)],
    }
    if draw(st.booleans()):
        message["reasoning_content"] = draw(PROSE)
    return response(message, "tool_calls"), tools


FW, ASCII = "｜DSML｜", "|DSML|"
SPECIALS = [
    "<｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜latest_reminder｜>",
    "<｜tool▁calls▁begin｜>",
    "<|im_end|>",
    "<|endoftext|>",
]


@st.composite
def markup_leaks(draw: st.DrawFn) -> tuple[Json, list[Json], str]:
    """DSML (full-width, ASCII, stripped) blocks, bare invokes, V3.2 block names, truncations,
    special tokens; in content or reasoning_content, with or without surrounding prose."""
    tools = draw(toolsets())
    call = draw(calls_for(tools))
    bar = draw(st.sampled_from([FW, ASCII, ""]))
    form = draw(st.sampled_from(["block_v4", "block_v32", "bare", "special"]))
    if form == "special":
        markup = draw(st.sampled_from(SPECIALS))
    elif form == "bare":
        markup = shapes.dsml_invoke(*call, bar=bar)
    else:
        block = "tool_calls" if form == "block_v4" else "function_calls"
        markup = shapes.dsml_block([call], block=block, bar=bar)
    if form != "special" and draw(st.booleans()):  # unterminated: cut after the first tag
        first_tag = markup.index(">") + 1
        markup = markup[: draw(st.integers(first_tag, len(markup)))]
    text = draw(st.sampled_from(["", "Let me check. ", "Sure.\n"])) + markup
    text += draw(st.sampled_from(["", " Done.", "\n"]))
    field = draw(st.sampled_from(["content", "reasoning_content"]))
    keep_calls = draw(st.booleans())
    message: Json = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call_obj(call[0], draw(st.sampled_from([json.dumps(call[1]), "{}"])))]
        if keep_calls
        else None,
    }
    message[field] = text
    finish = "tool_calls" if keep_calls else draw(st.sampled_from(["stop", "length"]))
    return response(message, finish), tools, f"{form}/{bar or 'stripped'}/{field}"


@st.composite
def malformed_calls(draw: st.DrawFn) -> tuple[Json, list[Json], str]:
    tools = draw(toolsets())
    name, args = draw(calls_for(tools))
    schema = next(t for t in tools if t["function"]["name"] == name)["function"]["parameters"]
    how = draw(st.sampled_from(["truncated", "trailing", "not_object", "unknown", "schema"]))
    arguments = json.dumps(args)
    if how == "truncated":
        arguments = arguments[: draw(st.integers(0, len(arguments) - 1))]
    elif how == "trailing":
        arguments += draw(st.sampled_from(["}", ",", " x", "]"]))
    elif how == "not_object":
        arguments = json.dumps(draw(st.one_of(st.lists(st.integers()), st.integers(), PHRASE)))
    elif how == "unknown":
        known = {t["function"]["name"] for t in tools}
        name = draw(SAFE_NAME.filter(lambda n: n not in known))
    else:
        broken = dict(args)
        required = schema["required"][0]
        kind = draw(st.sampled_from(["drop", "type", "extra"]))
        if kind == "drop":
            broken.pop(required)
        elif kind == "type":
            sub = schema["properties"][required]
            broken[required] = [1, 2] if sub.get("type") != "array" else "x"
        else:
            assume(schema["additionalProperties"] is False)
            extra = draw(SAFE_NAME.filter(lambda k: k not in schema["properties"]))
            broken[extra] = 1
        arguments = json.dumps(broken)
    message = {"role": "assistant", "content": None, "tool_calls": [call_obj(name, arguments)]}
    return response(message, "tool_calls"), tools, how


@st.composite
def degenerate_outputs(draw: st.DrawFn) -> tuple[Json, list[Json], str]:
    tools = draw(toolsets())
    call = draw(calls_for(tools))
    how = draw(st.sampled_from(["tail_loop", "repeated_sentence", "tag_soup", "garbage", "calls"]))
    calls: list[Json] | None = None
    if how == "tail_loop":
        unit = draw(PHRASE) + draw(st.sampled_from([" ", ". ", ", ", "\n", ""]))
        # >= 3 whole periods and >= 48 chars even after cutting the last unit short
        repeats = max(3, -(-48 // len(unit))) + 1 + draw(st.integers(0, 30))
        text = draw(st.sampled_from(["", "Let me think. "])) + unit * repeats
        text = text[: len(text) - draw(st.integers(0, len(unit) - 1))]  # max_tokens cut
    elif how == "repeated_sentence":
        sentence = draw(SENTENCE)
        assume(len(sentence) >= 8)
        times = draw(st.integers(3, 6))
        text = "Okay. " + " ".join([sentence] * times) + " " + draw(SENTENCE)
    elif how == "tag_soup":
        tags = st.sampled_from(["<div>", "</div>", "<span>", "</p>", '<a href="x">', "<br/>",
                                'name="x">', 'string="false">', "</td>"])  # fmt: skip
        text = "".join(draw(st.lists(tags, min_size=8, max_size=40)))
    elif how == "garbage":
        base = list(draw(st.sampled_from(PARAGRAPHS)))
        for position in draw(st.lists(st.integers(0, len(base)), min_size=3, max_size=8)):
            base.insert(position, draw(st.sampled_from(["\ufffd", "\x07", "\x1b", "\ue000"])))
        text = "".join(base)
    else:
        text = ""
        arguments = json.dumps(call[1])
        calls = [call_obj(call[0], arguments, i) for i in range(draw(st.integers(3, 6)))]
    field = draw(st.sampled_from(["content", "reasoning_content"]))
    message: Json = {"role": "assistant", "content": None, "tool_calls": calls}
    if text:
        message[field] = text
    return response(message, "length" if text else "tool_calls"), tools, how


def classify_all(resp: Json, tools: list[Json], must_call: bool = True) -> Verdict:
    verdict = classify_response(resp, tools=tools, must_call=must_call)
    assert len(verdict.snippet) <= SNIPPET_CHARS
    assert verdict.reason
    return verdict


# --- properties -----------------------------------------------------------------------------

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(well_formed())
def test_every_well_formed_output_is_ok(case: tuple[Json, list[Json]]) -> None:
    resp, tools = case
    verdict = classify_all(resp, tools)
    assert verdict.kind is VerdictKind.OK, verdict
    assert not verdict.leak


@SETTINGS
@given(markup_leaks())
def test_every_markup_leak_is_flagged(case: tuple[Json, list[Json], str]) -> None:
    resp, tools, label = case
    verdict = classify_all(resp, tools)
    assert verdict.kind is VerdictKind.LEAKED_MARKUP, (label, verdict)
    assert verdict.leak and verdict.snippet


@SETTINGS
@given(malformed_calls())
def test_every_malformed_call_is_flagged(case: tuple[Json, list[Json], str]) -> None:
    resp, tools, label = case
    verdict = classify_all(resp, tools)
    assert verdict.kind is VerdictKind.MALFORMED_CALL, (label, verdict)


@SETTINGS
@given(degenerate_outputs())
def test_every_degenerate_output_is_flagged(case: tuple[Json, list[Json], str]) -> None:
    resp, tools, label = case
    verdict = classify_all(resp, tools)
    assert verdict.kind is VerdictKind.DEGENERATE, (label, verdict)


@SETTINGS
@given(toolsets(), PROSE, st.sampled_from([None, []]))
def test_a_turn_without_a_call_is_missing_call_only_when_one_was_required(
    tools: list[Json], content: str, calls: list[Json] | None
) -> None:
    resp = response({"role": "assistant", "content": content, "tool_calls": calls}, "stop")
    assert classify_all(resp, tools, must_call=True).kind is VerdictKind.MISSING_CALL
    assert classify_all(resp, tools, must_call=False).kind is VerdictKind.OK


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32))
def test_every_engine_double_shape_gets_its_expected_verdict(seed: int) -> None:
    for sample in mixed_responses(2 * len(shapes.Shape), seed, CANARY_TOOLS):
        verdict = classify_all(sample.response, sample.tools)
        assert verdict.kind.value == sample.expected, (sample.shape, verdict)


# --- SSE ------------------------------------------------------------------------------------


@SETTINGS
@given(
    st.one_of(
        well_formed().map(lambda c: (c[0], c[1])),
        markup_leaks().map(lambda c: (c[0], c[1])),
        malformed_calls().map(lambda c: (c[0], c[1])),
        degenerate_outputs().map(lambda c: (c[0], c[1])),
    ),
    st.integers(0, 2**32),
    st.sampled_from(["text", "bytes", "chunks", "crlf"]),
)
def test_a_streamed_response_assembles_to_the_same_message_and_verdict(
    case: tuple[Json, list[Json]], seed: int, form: str
) -> None:
    import random

    resp, tools = case
    resp["usage"] = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    chunks = shapes.stream_chunks(resp, random.Random(seed), include_usage=True)
    text = shapes.sse_text(chunks)
    stream: Any = {
        "text": text,
        "bytes": text.encode(),
        "chunks": chunks,
        "crlf": text.replace("\n", "\r\n"),
    }[form]
    assembled = assemble_stream(stream)
    original, rebuilt = resp["choices"][0], assembled["choices"][0]
    assert rebuilt["finish_reason"] == original["finish_reason"]
    for key in ("content", "reasoning_content"):
        assert (rebuilt["message"].get(key) or None) == (original["message"].get(key) or None)
    assert rebuilt["message"]["tool_calls"] == (original["message"]["tool_calls"] or None)
    assert assembled["usage"] == resp["usage"]
    assert classify_response(assembled, tools=tools, must_call=True) == classify_response(
        resp, tools=tools, must_call=True
    )


RAW_SSE = (
    ": keep-alive comment\n"
    "event: message\n"
    'data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"dsv4",'
    '"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'
    'data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b",'
    '"type":"function","function":{"name":"run_","arguments":""}}]},"finish_reason":null}]}\n\n'
    'data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a",'
    '"type":"function","function":{"name":"get_weather","arguments":"{\\"loc"}}]}}]}\n\n'
    'data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,'
    '"function":{"name":"sql","arguments":"{\\"query\\": \\"SELECT 1\\", "}}]}}]}\n\n'
    # one event split over two data lines (joined with a newline, per the SSE spec)
    'data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,\n'
    'data: "function":{"arguments":"ation\\": \\"Oslo\\"}"}}]}}]}\n\n'
    'data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,'
    '"function":{"arguments":"\\"database\\": \\"ops\\"}"}}]}}]}\n\n'
    'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
    "data: [DONE]\n\n"
)


def test_raw_sse_with_parallel_calls_comments_and_multiline_data() -> None:
    assembled = assemble_stream(RAW_SSE)
    assert assembled["id"] == "c1" and assembled["model"] == "dsv4"
    choice = assembled["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {
            "id": "a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"location": "Oslo"}'},
        },
        {
            "id": "b",
            "type": "function",
            "function": {
                "name": "run_sql",  # names concatenate across deltas, as in OpenAI's SDK
                "arguments": '{"query": "SELECT 1", "database": "ops"}',
            },
        },
    ]
    assert classify_response(assembled, tools=CANARY_TOOLS, must_call=True).kind is VerdictKind.OK


def test_stream_errors() -> None:
    with pytest.raises(IncompleteStream):
        assemble_stream(RAW_SSE.replace("data: [DONE]\n\n", ""))
    assert assemble_stream(RAW_SSE.replace("data: [DONE]\n\n", ""), require_done=False)
    with pytest.raises(StreamError):
        assemble_stream('data: {"choices": [\n\ndata: [DONE]\n\n')
    error = assemble_stream('data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n')
    verdict = classify_response(error, tools=CANARY_TOOLS, must_call=True)
    assert verdict.kind is VerdictKind.ERROR and "boom" in verdict.snippet


# --- details --------------------------------------------------------------------------------


def test_non_completions_are_errors_not_leaks() -> None:
    bodies: list[dict[str, Any]] = [
        {"object": "error", "message": "bad"},
        {"choices": []},
        {"choices": [{}]},
    ]
    for body in bodies:
        verdict = classify_response(body, tools=CANARY_TOOLS, must_call=True)
        assert verdict.kind is VerdictKind.ERROR and not verdict.leak


def test_markup_inside_arguments_is_a_leak() -> None:
    arguments = json.dumps({"location": f'<{FW}parameter name="location">Oslo'})
    resp = response(
        {"role": "assistant", "content": None, "tool_calls": [call_obj("get_weather", arguments)]},
        "tool_calls",
    )
    verdict = classify_response(resp, tools=CANARY_TOOLS, must_call=True)
    assert verdict.kind is VerdictKind.LEAKED_MARKUP and "arguments" in verdict.reason


def test_think_tags_count_only_in_content() -> None:
    assert find_markup("<think>hmm</think> It is sunny.") is not None
    assert find_markup("<think>hmm</think> It is sunny.", content=False) is None


def test_long_snippets_are_cut_to_200_chars() -> None:
    text = "x" * 500 + shapes.dsml_block([("get_weather", {"location": "Oslo" * 100})])
    verdict = classify_response(
        response({"role": "assistant", "content": text, "tool_calls": None}, "stop"),
        tools=CANARY_TOOLS,
        must_call=True,
    )
    assert verdict.kind is VerdictKind.LEAKED_MARKUP
    assert len(verdict.snippet) == SNIPPET_CHARS and FW in verdict.snippet


def test_a_broken_tool_definition_is_a_caller_error() -> None:
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]
    with pytest.raises(InvalidToolSchema, match="'f'"):
        classify_response(
            response({"role": "assistant", "content": "hi"}, "stop"), tools=bad, must_call=False
        )


def test_the_input_is_not_modified() -> None:
    sample = mixed_responses(2, 7, CANARY_TOOLS)[1]
    before = copy.deepcopy(sample.response)
    classify_response(sample.response, tools=sample.tools, must_call=True)
    assert sample.response == before


# --- false positives on normal prose --------------------------------------------------------


def test_no_false_positive_on_the_written_paragraphs() -> None:
    for paragraph in PARAGRAPHS:
        assert degenerate_reason(paragraph) is None, paragraph
        assert find_markup(paragraph) is None, paragraph
        resp = response({"role": "assistant", "content": paragraph, "tool_calls": None}, "stop")
        assert classify_response(resp, tools=CANARY_TOOLS, must_call=False).kind is VerdictKind.OK


def test_degenerate_false_positive_rate_on_normal_prose() -> None:
    """bench/detector.py prints the figure; on this corpus (~870 texts) it is 0."""
    corpus = normal_prose()
    assert len(corpus) > 500
    flagged = [t for t in corpus if degenerate_reason(t) is not None]
    marked = [t for t in corpus if find_markup(t) is not None]
    assert len(flagged) <= len(corpus) // 500, flagged[:3]  # at most 0.2%
    assert marked == []


def test_the_garbage_class_is_exactly_the_unicode_categories() -> None:
    """The garbage rule scans with one regex class; it must equal the rule it replaced:
    U+FFFD, or category Cc (not tab, newline, CR) or Co, for every code point."""
    import unicodedata

    from dsv4_operator.leak.degenerate import _GARBAGE

    differ = [
        hex(cp)
        for cp in range(0x110000)
        if (_GARBAGE.match(chr(cp)) is not None)
        != (
            chr(cp) == "\ufffd"
            or (unicodedata.category(chr(cp)) in ("Cc", "Co") and chr(cp) not in "\t\n\r")
        )
    ]
    assert differ == []

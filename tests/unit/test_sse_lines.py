"""SSE assembly: the one-scan path for engine-shaped streams agrees with the event-by-event
path on any text, and lines end only at CR, LF or CRLF (JSON leaves U+2028 and U+0085 raw)."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4_engine_double import shapes
from dsv4_engine_double.corpus import mixed_responses
from dsv4_operator.canary.scenario import CANARY_TOOLS
from dsv4_operator.canary.transport import send
from dsv4_operator.leak import sse
from dsv4_operator.leak.sse import IncompleteStream, StreamError, assemble_stream

SAMPLES = mixed_responses(24, seed=7, tools=CANARY_TOOLS)
RAW_LINE_ENDS = "\u2028\u2029\u0085"  # line ends to str.splitlines, plain characters to JSON


def _engine_stream(index: int, seed: int, odd_content: bool) -> str:
    """What SGLang streams for a corpus response: `data: {...}` events, non-ASCII raw."""
    response = json.loads(json.dumps(SAMPLES[index].response))
    message = response["choices"][0]["message"]
    if odd_content:
        message["content"] = f"line one{RAW_LINE_ENDS}line two " + (message.get("content") or "")
    chunks = shapes.stream_chunks(response, random.Random(seed))
    return shapes.sse_text(chunks)


# Edits that move a stream off the engine's shape, each a case the one-scan path must either
# read as the general path does or hand over to it.
def _events(text: str) -> list[str]:
    return text.split("\n\n")


def _rejoin(events: list[str]) -> str:
    return "\n\n".join(events)


def _comment_before(text: str, at: int) -> str:
    events = _events(text)
    events[at % len(events)] = ": t=1.5\n" + events[at % len(events)]
    return _rejoin(events)


def _split_data_line(text: str, at: int) -> str:  # one event, two data lines (joined by \n)
    events = _events(text)
    event = events[at % len(events)]
    cut = event.find(",")
    if cut > 0:
        events[at % len(events)] = event[:cut] + "\ndata: " + event[cut:]
    return _rejoin(events)


def _field_between(text: str, at: int) -> str:  # an `event:` line inside an event
    events = _events(text)
    events[at % len(events)] = "event: message\n" + events[at % len(events)]
    return _rejoin(events)


def _insert(payload_line: str) -> Callable[[str, int], str]:
    def edit(text: str, at: int) -> str:
        events = _events(text)
        events.insert(at % (len(events) + 1), payload_line)
        return _rejoin(events)

    return edit


EDITS: dict[str, Callable[[str, int], str]] = {
    "crlf": lambda text, at: text.replace("\n", "\r\n"),
    "cr": lambda text, at: text.replace("\n", "\r"),
    "comment": _comment_before,
    "two data lines": _split_data_line,
    "event field": _field_between,
    "bare data line": _insert("data"),
    "bare data at the end": lambda text, at: text.replace("data: [DONE]\n\n", "") + "data",
    "no space": lambda text, at: text.replace("data: ", "data:", 1 + at % 3),
    "two spaces": lambda text, at: text.replace("data: ", "data:  ", 1 + at % 3),
    "trailing blanks": lambda text, at: text.replace("}\n\n", "} \t\n\n", 1 + at % 3),
    "no done": lambda text, at: text.replace("data: [DONE]\n\n", ""),
    "unterminated": lambda text, at: text.rstrip("\n"),
    "not json": _insert('data: {"choices": ['),
    "not an object": _insert("data: [1, 2]"),
    "extra data": _insert("data: {} {}"),
    "two objects": _insert("data: {},{}"),
    "empty data": _insert("data:"),
    "byte order mark": _insert("data: \ufeff{}"),
    "unicode space after": _insert("data: {}\u00a0"),
    "space-only line": lambda text, at: text.replace("\n\n", "\n \n", 1 + at % 2),
    "error chunk": _insert('data: {"error": {"message": "boom"}}'),
    "after done": lambda text, at: text + "data: not json\n\n",
}


def _outcome(assemble: Callable[..., dict[str, Any]], text: str | bytes, done: bool) -> object:
    try:
        return assemble(text, require_done=done)
    except StreamError as error:  # the same error, with the same message
        return (type(error).__name__, str(error))


@settings(max_examples=600, deadline=None, derandomize=True)
@given(
    st.integers(0, len(SAMPLES) - 1),
    st.integers(0, 2**16),
    st.booleans(),
    st.lists(st.tuples(st.sampled_from(sorted(EDITS)), st.integers(0, 50)), max_size=3),
    st.booleans(),
)
def test_the_one_scan_path_reads_every_text_as_the_general_path(
    index: int, seed: int, odd_content: bool, edits: list[tuple[str, int]], done: bool
) -> None:
    text = _engine_stream(index, seed, odd_content)
    for name, at in edits:
        text = EDITS[name](text, at)
    general = _outcome(sse._assemble_general, text, done)
    assert _outcome(assemble_stream, text, done) == general
    assert _outcome(assemble_stream, text.encode(), done) == general


@pytest.mark.parametrize("index", range(len(SAMPLES)))
def test_engine_shaped_streams_take_the_one_scan_path(index: int) -> None:
    text = _engine_stream(index, seed=index, odd_content=True)
    payloads = sse._one_line_payloads(text)
    assert payloads is not None and sse._parsed_payloads(payloads) is not None
    assembled = assemble_stream(text)
    original = SAMPLES[index].response["choices"][0]["message"]
    assert assembled["choices"][0]["message"]["content"].startswith(
        f"line one{RAW_LINE_ENDS}line two "
    )
    assert assembled["choices"][0]["message"]["tool_calls"] == (original["tool_calls"] or None)


@pytest.mark.parametrize("edit", ["crlf", "cr", "two data lines", "bare data line"])
def test_streams_off_the_engine_shape_take_the_general_path(edit: str) -> None:
    text = EDITS[edit](_engine_stream(1, seed=1, odd_content=False), 3)
    assert sse._one_line_payloads(text) is None


def test_unicode_line_separators_inside_json_do_not_end_a_line() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": f"a{RAW_LINE_ENDS}b"}}]}
    text = f"data: {json.dumps(chunk, ensure_ascii=False)}\n\ndata: [DONE]\n\n"
    # The text as engines send it (the one-scan path) and with CRLF (the general path).
    for form in (text, text.replace("\n", "\r\n")):
        assembled = assemble_stream(form)
        assert assembled["choices"][0]["message"]["content"] == f"a{RAW_LINE_ENDS}b"
    with pytest.raises(IncompleteStream):
        assemble_stream(text.replace("data: [DONE]\n\n", ""))
    with pytest.raises(StreamError, match="not UTF-8"):  # the canary reads bytes now
        assemble_stream(text.encode()[:9] + b"\xff" + text.encode()[9:])


async def test_the_canary_reads_a_stream_whose_content_has_unicode_line_separators() -> None:
    content = f"before{RAW_LINE_ENDS}after"
    events = [
        {"id": "c", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": content}}]},
        {"id": "c", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]  # fmt: skip

    async def chunks() -> AsyncIterator[bytes]:
        for event in events:  # pydantic's model_dump_json leaves U+2028 and U+0085 raw
            yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=chunks())

    async with httpx.AsyncClient(transport=httpx.MockTransport(reply)) as client:
        outcome = await send(
            client, "http://router.test/v1/chat/completions", {"stream": True}, 10, True
        )
    assert outcome.status == 200 and outcome.body is not None
    assert outcome.body["choices"][0]["message"]["content"] == content

"""SSE assembly: a streamed chat completion turned into the non-streaming response shape."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class StreamError(ValueError):
    """An SSE stream that cannot be assembled (bad JSON in a `data:` line)."""


class IncompleteStream(StreamError):
    """The SSE stream ended without `data: [DONE]`."""


DONE = "[DONE]"


#: SSE line ends (WHATWG server-sent events: CRLF, LF or CR), not `str.splitlines`: JSON
#: carries U+2028, U+2029 and U+0085 unescaped (as SGLang's msgspec and pydantic encoders
#: write its chunks), and splitting a chunk there made a well-formed stream look broken.
_LINE_END = re.compile(r"\r\n|\r|\n")
#: A data line (`data:`, one optional space dropped) that ends its event: a blank line or the
#: end of the text follows. In text without CR, `.` and `^` stop at and start after LF only.
_EVENT_END_DATA = re.compile(r"^data: ?(.*)(?:\n\n|\n?\Z)", re.MULTILINE)
#: A bare `data` line (a data field with no colon): such text takes the line-by-line path.
_BARE_DATA = re.compile(r"^data$", re.MULTILINE)
_decode_json = json.JSONDecoder().raw_decode
_JSON_SPACE = " \t\n\r"


def _sse_events(text: str) -> Iterable[str]:
    """The data payloads of an SSE text stream (multi-line data joined with newlines)."""
    data: list[str] = []
    for line in _LINE_END.split(text):
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _one_line_payloads(text: str) -> list[str] | None:
    """The data payloads, found by one regex scan, when each data line ends its event (as
    engines stream: `data: {...}` then a blank line); None when the text needs
    `_sse_events` (a CR, a bare `data` line, or a data line with more of its event after it)."""
    bare_data_possible = "data\n" in text or text.endswith("data")
    if "\r" in text or (bare_data_possible and _BARE_DATA.search(text)):
        return None
    payloads = _EVENT_END_DATA.findall(text)
    # Every data line was one that ends its event: no event holds two.
    if len(payloads) != text.count("\ndata:") + text.startswith("data:"):
        return None
    return payloads


def _parsed_payloads(payloads: Iterable[str]) -> tuple[list[Mapping[str, Any]], bool] | None:
    """Each payload parsed up to `[DONE]`, and whether it came; None when one is not a JSON
    object (the general path then says which). `raw_decode` per payload: `json.loads`'
    checks around it cost more than the parse of a chunk."""
    chunks: list[Mapping[str, Any]] = []
    for payload in payloads:
        body = payload.strip(_JSON_SPACE)
        if body == DONE:
            return chunks, True
        try:
            chunk, end = _decode_json(body)
        except ValueError:
            return None
        if end != len(body) or not isinstance(chunk, dict):
            return None
        chunks.append(chunk)
    return chunks, False


def _merge_delta(target: dict[str, Any], delta: Mapping[str, Any]) -> None:
    """Accumulate one streamed tool-call delta (strings concatenate; id/type/index replace)."""
    for key, value in delta.items():
        if value is None:
            continue
        if key in ("id", "type", "index"):
            target[key] = value
        elif isinstance(value, Mapping):
            _merge_delta(target.setdefault(key, {}), value)
        elif isinstance(value, str):
            target[key] = target.get(key, "") + value
        else:
            target[key] = value


def assemble_stream(
    stream: str | bytes | Iterable[Mapping[str, Any]],
    *,
    require_done: bool = True,
) -> dict[str, Any]:
    """Assemble a streamed chat completion into the non-streaming response shape.

    `stream` is the raw SSE text (str or UTF-8 bytes; lines end at CR, LF or CRLF only), or
    the already-parsed chunk dicts. Raises `StreamError` on bytes that are not UTF-8 or a
    `data:` line that is not JSON, and `IncompleteStream` when `require_done` and the stream
    has no `data: [DONE]`. An error chunk (`{"error": ...}`) yields `{"error": ...}`, which
    `classify_response` turns into an `error` verdict.
    """
    if isinstance(stream, bytes):
        try:
            stream = stream.decode("utf-8")
        except UnicodeDecodeError as error:
            raise StreamError(f"stream is not UTF-8: {error}") from error
    if not isinstance(stream, str):
        chunks = list(stream)
        if not all(isinstance(chunk, Mapping) for chunk in chunks):
            raise TypeError("assemble_stream: SSE text or bytes, or parsed chunk dicts")
        return _assembled(chunks, True, require_done=require_done)  # no [DONE] to carry
    simple = _one_line_payloads(stream)
    parsed = _parsed_payloads(simple) if simple is not None else None
    if parsed is not None:
        return _assembled(*parsed, require_done=require_done)
    return _assemble_general(stream, require_done=require_done)


def _assemble_general(text: str, *, require_done: bool) -> dict[str, Any]:
    """Any SSE text, event by event (the errors quote the data line)."""
    chunks: list[Mapping[str, Any]] = []
    done = False
    for payload in _sse_events(text):
        if payload.strip() == DONE:
            done = True
            break
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError as error:
            raise StreamError(f"data line is not JSON: {payload[:120]!r}") from error
        if not isinstance(chunk, Mapping):
            raise StreamError(f"data line is not a JSON object: {payload[:120]!r}")
        chunks.append(chunk)
    return _assembled(chunks, done, require_done=require_done)


def _assembled(
    chunks: list[Mapping[str, Any]], done: bool, *, require_done: bool
) -> dict[str, Any]:
    for chunk in chunks:
        if "error" in chunk:
            return {"error": chunk["error"]}
    if require_done and not done:
        raise IncompleteStream(f"stream ended without data: {DONE} after {len(chunks)} chunks")
    return _assemble_chunks(chunks)


def _assemble_chunks(chunks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    head = chunks[0] if chunks else {}
    result: dict[str, Any] = {
        "id": head.get("id"),
        "object": "chat.completion",
        "created": head.get("created"),
        "model": head.get("model"),
    }
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if chunk.get("usage"):
            result["usage"] = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = int(choice.get("index", 0))
            state = choices.get(index)
            if state is None:  # not setdefault: that would build this for every chunk
                state = choices[index] = {
                    "role": "assistant", "content": [], "reasoning": [], "calls": {}, "finish": None
                }  # fmt: skip
            delta = choice.get("delta") or {}
            if delta.get("role"):
                state["role"] = delta["role"]
            if delta.get("content"):
                state["content"].append(delta["content"])
            if delta.get("reasoning_content"):
                state["reasoning"].append(delta["reasoning_content"])
            for position, call in enumerate(delta.get("tool_calls") or []):
                key = int(call.get("index", position))
                _merge_delta(state["calls"].setdefault(key, {}), call)
            if choice.get("finish_reason") is not None:
                state["finish"] = choice["finish_reason"]
    result["choices"] = []
    for index in sorted(choices):
        state = choices[index]
        calls = [state["calls"][k] for k in sorted(state["calls"])]
        for call in calls:
            call.pop("index", None)
            call.setdefault("type", "function")
            call.setdefault("function", {}).setdefault("arguments", "")
        message: dict[str, Any] = {
            "role": state["role"],
            "content": "".join(state["content"]) if state["content"] else None,
            "tool_calls": calls or None,
        }
        if state["reasoning"]:
            message["reasoning_content"] = "".join(state["reasoning"])
        result["choices"].append(
            {"index": index, "message": message, "finish_reason": state["finish"]}
        )
    return result

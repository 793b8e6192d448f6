"""SSE assembly: a streamed chat completion turned into the non-streaming response shape."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class StreamError(ValueError):
    """An SSE stream that cannot be assembled (bad JSON in a `data:` line)."""


class IncompleteStream(StreamError):
    """The SSE stream ended without `data: [DONE]`."""


DONE = "[DONE]"


def _sse_events(text: str) -> Iterable[str]:
    """The data payloads of an SSE text stream (multi-line data joined with newlines)."""
    data: list[str] = []
    for line in text.splitlines():
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


def _line_events(lines: Iterable[str | bytes]) -> Iterable[str]:
    for item in lines:
        line = item.decode("utf-8") if isinstance(item, bytes) else item
        for part in line.splitlines():
            field, _, value = part.partition(":")
            if field == "data":
                yield value[1:] if value.startswith(" ") else value


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
    stream: str | bytes | Iterable[str | bytes | Mapping[str, Any]],
    *,
    require_done: bool = True,
) -> dict[str, Any]:
    """Assemble a streamed chat completion into the non-streaming response shape.

    `stream` is the raw SSE text (str or bytes), or an iterable of `data:` lines (as from
    `httpx.Response.aiter_lines()`; other lines are skipped), or of already-parsed chunk dicts.
    Raises `StreamError` on a `data:` line that is not JSON and `IncompleteStream` when
    `require_done` and the stream has no `data: [DONE]`. An error chunk (`{"error": ...}`)
    yields `{"error": ...}`, which `classify` turns into an `error` verdict.
    """
    if isinstance(stream, bytes):
        stream = stream.decode("utf-8")
    chunks: list[Mapping[str, Any]] = []
    done = False
    if isinstance(stream, str):
        payloads: Iterable[str | Mapping[str, Any]] = _sse_events(stream)
    else:
        items = list(stream)
        if all(isinstance(i, Mapping) for i in items):
            payloads = [i for i in items if isinstance(i, Mapping)]
            done = True  # parsed chunks carry no [DONE] sentinel
        elif any(isinstance(i, Mapping) for i in items):
            raise TypeError("assemble_stream: mix of parsed chunks and SSE lines")
        else:
            payloads = _line_events(i for i in items if isinstance(i, str | bytes))
    for payload in payloads:
        if isinstance(payload, Mapping):
            chunks.append(payload)
            continue
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
            state = choices.setdefault(
                index,
                {"role": "assistant", "content": [], "reasoning": [], "calls": {}, "finish": None},
            )
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

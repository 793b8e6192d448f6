"""What the engine double answers: well-formed tool calls and the realistic leak shapes.

The leak shapes follow docs/engine-notes.md#leak-shapes: DSML markup returned as `content`
with `tool_calls: null` and `finish_reason: "stop"`, a bare invoke, the V3.2 `function_calls`
block name under V4, an unterminated section, DSML stripped by the detokenizer, stray special
tokens, tag soup (`</invoke></invoke> string="false">false">1`), repetition loops, garbled
text, tool calls with broken arguments, and a dropped call (the prose only). `EXPECTED_KIND`
says which detector verdict each shape must get. `corrupted` builds one answer of each shape
for the detector's tests; the double itself answers what a release's parser makes of the
model's output (outputs.py, parsers.py), labelled with these shapes. Everything here is pure;
`random.Random` instances carry the draws.
"""

from __future__ import annotations

import itertools
import json
import random
import string
import time
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any

Tools = Sequence[Mapping[str, Any]]
Call = tuple[str, dict[str, Any]]

FW = "｜DSML｜"  # U+FF5C FULLWIDTH VERTICAL LINE on both sides
ASCII = "|DSML|"
EOS = "<｜end▁of▁sentence｜>"

CITIES = ["Hangzhou", "Paris", "Lagos", "Osaka", "Lima", "Oslo", "Pune", "Quito", "Tunis", "Perth"]
TOPICS = [
    "hierarchical cache eviction",
    "prefill decode disaggregation",
    "tool call parser",
    "bootstrap port",
    "CUDA graph capture",
    "KV cache dtype",
    "router cache aware policy",
    "index-K buffer",
]
SQL = [
    "SELECT region, count(*) FROM orders GROUP BY region",
    "SELECT name FROM customers WHERE active = true LIMIT 10",
    "SELECT avg(latency_ms) FROM requests WHERE day = current_date",
    "SELECT sku, sum(qty) FROM shipments GROUP BY sku ORDER BY 2 DESC",
]
REASONING = [
    "The user asked for {what}; the {tool} tool gives exactly that, so I will call it.",
    "Next step: {what}. I should use {tool} with the right arguments.",
    "I have the previous result. Now {what}, which needs {tool}.",
]
PREAMBLES = ["Let me check that.", "I'll look that up now.", "One moment, calling the tool."]
PROSE = [
    "Here is a summary of what I found. The service is healthy and the numbers look normal.",
    "I checked the data you asked about; nothing unusual stands out in the latest results.",
    "All requested steps are done. Let me know if you want me to look at anything else.",
]


class Shape(StrEnum):
    """A corrupted answer."""

    DSML_BLOCK = "dsml_block"
    BARE_INVOKE = "bare_invoke"
    V32_BLOCK_NAME = "v32_block_name"
    UNTERMINATED = "unterminated"
    ASCII_DSML = "ascii_dsml"
    STRIPPED_DSML = "stripped_dsml"
    SPECIAL_TOKEN = "special_token"
    REASONING_LEAK = "reasoning_leak"
    EMPTY_ARGS_WITH_MARKUP = "empty_args_with_markup"
    TAG_SOUP = "tag_soup"
    ATTRIBUTE_SOUP = "attribute_soup"
    REPETITION = "repetition"
    GARBLED = "garbled"
    BAD_JSON_ARGS = "bad_json_args"
    SCHEMA_VIOLATION = "schema_violation"
    UNKNOWN_TOOL = "unknown_tool"
    DEGENERATE_ARGS = "degenerate_args"
    REPEATED_CALLS = "repeated_calls"
    PROSE_ONLY = "prose_only"
    DROPPED = "dropped"  # the parser dropped the call: the prose only, "stop", no tool_calls
    EMPTY_ARGS = "empty_args"  # a call whose arguments recipe could not read, as `{}`
    EMPTY = "empty"  # no content, no call: recipe held a U+FFFD ending and dropped it


_MARKUP = "leaked_markup"
EXPECTED_KIND: dict[Shape, str] = {
    Shape.DSML_BLOCK: _MARKUP,
    Shape.BARE_INVOKE: _MARKUP,
    Shape.V32_BLOCK_NAME: _MARKUP,
    Shape.UNTERMINATED: _MARKUP,
    Shape.ASCII_DSML: _MARKUP,
    Shape.STRIPPED_DSML: _MARKUP,
    Shape.SPECIAL_TOKEN: _MARKUP,
    Shape.REASONING_LEAK: _MARKUP,
    Shape.EMPTY_ARGS_WITH_MARKUP: _MARKUP,
    Shape.TAG_SOUP: _MARKUP,
    Shape.ATTRIBUTE_SOUP: "degenerate",
    Shape.REPETITION: "degenerate",
    Shape.GARBLED: "degenerate",
    Shape.BAD_JSON_ARGS: "malformed_call",
    Shape.SCHEMA_VIOLATION: "malformed_call",
    Shape.UNKNOWN_TOOL: "malformed_call",
    Shape.DEGENERATE_ARGS: "degenerate",
    Shape.REPEATED_CALLS: "degenerate",
    Shape.PROSE_ONLY: "missing_call",
    Shape.DROPPED: "missing_call",
    Shape.EMPTY_ARGS: "malformed_call",
    Shape.EMPTY: "missing_call",
}


# --- arguments from a JSON schema -----------------------------------------------------------


def _string_for(prop: str, tool: str, rng: random.Random) -> str:
    key = prop.lower()
    if key in ("location", "city", "place"):
        return rng.choice(CITIES)
    if "sql" in tool.lower() or key in ("sql", "statement"):
        return rng.choice(SQL)
    if key in ("query", "q", "search", "topic", "text"):
        return rng.choice(TOPICS)
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 10)))


def instance_for(
    schema: Mapping[str, Any], rng: random.Random, *, tool: str = "", prop: str = ""
) -> Any:
    """A value valid against a simple JSON schema (object/string/integer/number/boolean/array,
    enum, required, minimum/maximum, minLength/maxLength, minItems/maxItems)."""
    if "enum" in schema:
        return rng.choice(list(schema["enum"]))
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties: Mapping[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        return {
            name: instance_for(sub, rng, tool=tool, prop=name)
            for name, sub in properties.items()
            if name in required or rng.random() < 0.5
        }
    if kind == "string":
        value = _string_for(prop, tool, rng)
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        value = value.ljust(low, "x")
        return value if high is None else value[: int(high)]
    if kind in ("integer", "number"):
        low = int(schema.get("minimum", 1))
        high = int(schema.get("maximum", low + 9))
        number = rng.randint(low, high)
        return number if kind == "integer" else number + 0.5 * (number < high)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        item = schema.get("items", {"type": "string"})
        low = int(schema.get("minItems", 1))
        high = int(schema.get("maxItems", max(low, 3)))
        return [
            instance_for(item, rng, tool=tool, prop=prop) for _ in range(rng.randint(low, high))
        ]
    return None


def tool_names(tools: Tools) -> list[str]:
    return [str(t["function"]["name"]) for t in tools]


def tool_schema(tools: Tools, name: str) -> Mapping[str, Any]:
    for tool in tools:
        if tool["function"]["name"] == name:
            schema: Mapping[str, Any] = tool["function"].get("parameters") or {"type": "object"}
            return schema
    raise KeyError(name)


def make_call(tools: Tools, name: str, rng: random.Random) -> Call:
    args = instance_for(tool_schema(tools, name), rng, tool=name)
    return name, args if isinstance(args, dict) else {}


# --- responses ------------------------------------------------------------------------------


def call_id(rng: random.Random) -> str:
    return "call_" + "".join(rng.choice(string.hexdigits.lower()) for _ in range(24))


def tool_call(name: str, arguments: str, rng: random.Random) -> dict[str, Any]:
    return {
        "id": call_id(rng),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def completion(
    message: Mapping[str, Any],
    finish_reason: str | None,
    *,
    model: str,
    rng: random.Random,
    prompt_tokens: int = 100,
) -> dict[str, Any]:
    """A non-streaming `/v1/chat/completions` body as SGLang returns it."""
    text = json.dumps(message, ensure_ascii=False)
    completion_tokens = max(1, len(text) // 4)
    return {
        "id": "".join(rng.choice(string.hexdigits.lower()) for _ in range(32)),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": dict(message),
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def reasoning_for(name: str, args: Mapping[str, Any], rng: random.Random) -> str:
    what = ", ".join(f"{k} {v}" for k, v in args.items()) or "the next step"
    return rng.choice(REASONING).format(what=what, tool=name)


def well_formed(
    calls: Sequence[Call], rng: random.Random, *, reasoning: str | None = None
) -> tuple[dict[str, Any], str]:
    """A correct answer: structured tool_calls with JSON arguments, finish_reason tool_calls."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call(n, json.dumps(a, ensure_ascii=False), rng) for n, a in calls],
    }
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message, "tool_calls"


def prose_answer(rng: random.Random, *, reasoning: str | None = None) -> tuple[dict[str, Any], str]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": rng.choice(PROSE),
        "tool_calls": None,
    }
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message, "stop"


# --- DSML -----------------------------------------------------------------------------------


def dsml_invoke(name: str, args: Mapping[str, Any], bar: str = FW) -> str:
    lines = [f'<{bar}invoke name="{name}">']
    for key, value in args.items():
        if isinstance(value, str):
            lines.append(f'<{bar}parameter name="{key}" string="true">{value}</{bar}parameter>')
        else:
            raw = json.dumps(value)
            lines.append(f'<{bar}parameter name="{key}" string="false">{raw}</{bar}parameter>')
    lines.append(f"</{bar}invoke>")
    return "\n".join(lines)


def dsml_block(calls: Sequence[Call], *, block: str = "tool_calls", bar: str = FW) -> str:
    """The DSML a V4 model emits (`block="function_calls"` is the V3.2 name)."""
    body = "\n".join(dsml_invoke(n, a, bar) for n, a in calls)
    return f"<{bar}{block}>\n{body}\n</{bar}{block}>"


def _leak(content: str, *, finish: str = "stop") -> tuple[dict[str, Any], str]:
    return {"role": "assistant", "content": content, "tool_calls": None}, finish


def loop_text(unit: str, rng: random.Random, chars: int = 400) -> str:
    """`unit` repeated to about `chars` characters (a repetition loop)."""
    return (unit * (chars // len(unit) + 2))[: chars + rng.randint(0, len(unit))]


def violating_args(schema: Mapping[str, Any], args: Mapping[str, Any]) -> dict[str, Any] | None:
    """Arguments that break `schema` (drop a required key, or a wrong type), or None."""
    required = list(schema.get("required", []))
    if required:
        broken = dict(args)
        broken.pop(required[0], None)
        return broken
    for key, sub in schema.get("properties", {}).items():
        kind = sub.get("type")
        if kind == "string" or "enum" in sub:
            return {**args, key: 12345}
        if kind in ("integer", "number", "boolean", "array", "object"):
            return {**args, key: "not a " + str(kind)}
    if schema.get("additionalProperties") is False:
        return {**args, "unexpected": True}
    return None


def corrupted(
    shape: Shape, tools: Tools, call: Call, rng: random.Random
) -> tuple[dict[str, Any], str]:
    """The message and finish_reason of one corrupted answer of `shape` for intended `call`."""
    name, args = call
    builders: dict[Shape, Callable[[], tuple[dict[str, Any], str]]] = {
        Shape.DSML_BLOCK: lambda: _leak(dsml_block([call])),
        Shape.BARE_INVOKE: lambda: _leak(dsml_invoke(name, args)),
        Shape.V32_BLOCK_NAME: lambda: _leak(dsml_block([call], block="function_calls")),
        Shape.UNTERMINATED: lambda: _leak(
            dsml_block([call])[: rng.randint(len(f"<{FW}tool_calls>") + 3, 60)]
        ),
        Shape.ASCII_DSML: lambda: _leak(dsml_block([call], bar=ASCII)),
        Shape.STRIPPED_DSML: lambda: _leak(dsml_block([call], bar="")),
        Shape.SPECIAL_TOKEN: lambda: (
            {
                "role": "assistant",
                "content": f"Let me check that.{EOS}",
                "tool_calls": [tool_call(name, json.dumps(args), rng)],
            },
            "tool_calls",
        ),
        Shape.REASONING_LEAK: lambda: (
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": f"I will call {name}.\n{dsml_block([call])}",
                "tool_calls": None,
            },
            "stop",
        ),
        Shape.EMPTY_ARGS_WITH_MARKUP: lambda: (
            {
                "role": "assistant",
                "content": dsml_invoke(name, args),
                "tool_calls": [tool_call(name, "{}", rng)],
            },
            "tool_calls",
        ),
        Shape.TAG_SOUP: lambda: _leak(
            '</invoke></invoke> string="false">false">1' * rng.randint(1, 4)
            + f'\n<{FW}parameter name="{next(iter(args), "x")}" string="false">false">1',
            finish="length",
        ),
        Shape.ATTRIBUTE_SOUP: lambda: _leak(attribute_soup(args), finish="length"),
        Shape.REPETITION: lambda: _leak(
            loop_text(f"I need to call {name} for {json.dumps(args)[:40]} first. ", rng),
            finish="length",
        ),
        Shape.GARBLED: lambda: _leak(garbled_text(rng), finish="length"),
        Shape.BAD_JSON_ARGS: lambda: well_formed_raw(
            name, json.dumps(args)[: max(1, rng.randint(1, max(1, len(json.dumps(args)) - 1)))], rng
        ),
        Shape.SCHEMA_VIOLATION: lambda: _schema_violation(tools, call, rng),
        Shape.UNKNOWN_TOOL: lambda: well_formed_raw(
            unknown_name(tools, name, rng), json.dumps(args), rng
        ),
        Shape.DEGENERATE_ARGS: lambda: well_formed_raw(
            name,
            json.dumps({**args, string_key(tools, name): loop_text("the the weather ", rng, 300)}),
            rng,
        ),
        Shape.REPEATED_CALLS: lambda: (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call(name, json.dumps(args), rng) for _ in range(4)],
            },
            "tool_calls",
        ),
        Shape.PROSE_ONLY: lambda: prose_answer(rng),
        Shape.DROPPED: lambda: _leak(rng.choice(PREAMBLES)),
        Shape.EMPTY_ARGS: lambda: well_formed_raw(name, "{}", rng),
        Shape.EMPTY: lambda: _leak("", finish="length"),
    }
    return builders[shape]()


def attribute_soup(args: Mapping[str, Any]) -> str:
    """Attributes and closing brackets with no tags around them."""
    pairs = list(args.items()) * 4 or [("x", 1)] * 8
    return (
        "".join(f'{k}="{v}"> string="false">{v}"> ' for k, v in pairs) + ' name="x" string="true">'
    )


def garbled_text(rng: random.Random) -> str:
    """Rare characters and broken bytes (#22811's "garbled text, rare characters")."""
    words = [
        rng.choice(["的", " param", "ü", "零", " Hang", "zhou", " 3", "\x07"]) for _ in range(40)
    ]
    for position in sorted(rng.sample(range(len(words)), 3)):
        words[position] = "\ufffd"
    return "".join(words)


def well_formed_raw(name: str, arguments: str, rng: random.Random) -> tuple[dict[str, Any], str]:
    return (
        {"role": "assistant", "content": None, "tool_calls": [tool_call(name, arguments, rng)]},
        "tool_calls",
    )


def unknown_name(tools: Tools, name: str, rng: random.Random) -> str:
    known = set(tool_names(tools))
    for candidate in (name[:-1], name + "_" + name.split("_")[-1], name + "s", "invoke"):
        if candidate and candidate not in known:
            return candidate
    return "tool_" + str(rng.randint(1000, 9999))


def string_key(tools: Tools, name: str) -> str:
    for key, sub in tool_schema(tools, name).get("properties", {}).items():
        if sub.get("type") == "string" and "enum" not in sub:
            return str(key)
    return "note"


def _schema_violation(tools: Tools, call: Call, rng: random.Random) -> tuple[dict[str, Any], str]:
    name, args = call
    broken = violating_args(tool_schema(tools, name), args)
    if broken is None:  # nothing in the schema to violate: break the JSON instead
        return well_formed_raw(name, json.dumps(args)[:-1] or "{", rng)
    return well_formed_raw(name, json.dumps(broken), rng)


# --- streaming ------------------------------------------------------------------------------


def _pieces(text: str, rng: random.Random, count: int) -> list[str]:
    if not text:
        return []
    cuts = sorted({rng.randint(1, max(1, len(text) - 1)) for _ in range(max(0, count - 1))})
    bounds = [0, *[c for c in cuts if 0 < c < len(text)], len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def stream_chunks(
    response: Mapping[str, Any], rng: random.Random, *, include_usage: bool = False
) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects that stream `response` (SGLang's delta layout)."""
    choice = response["choices"][0]
    message = choice["message"]
    base = {
        "id": response["id"],
        "object": "chat.completion.chunk",
        "created": response["created"],
        "model": response["model"],
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    for piece in _pieces(message.get("reasoning_content") or "", rng, 3):
        chunks.append(chunk({"reasoning_content": piece}))
    for piece in _pieces(message.get("content") or "", rng, 4):
        chunks.append(chunk({"content": piece}))
    for index, call in enumerate(message.get("tool_calls") or []):
        head = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [head]}))
        for piece in _pieces(call["function"]["arguments"], rng, 3):
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": response["usage"]})
    return chunks


def sse_text(chunks: Sequence[Mapping[str, Any]], *, done: bool = True) -> str:
    """Server-sent events of `chunks` (`data: {...}\\n\\n` each), then `data: [DONE]`."""
    body = "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks)
    return body + ("data: [DONE]\n\n" if done else "")

"""Classify one OpenAI chat-completion response as ok or as a kind of leak (the DSML detector).

A DSML-parsing SGLang (`--tool-call-parser deepseekv4`) turns the model's
`<｜DSML｜tool_calls>` block into structured `tool_calls`. When parsing fails, the markup is
returned as `content` with `tool_calls: null` and `finish_reason: "stop"`
(docs/engine-notes.md#leak-shapes).
`classify_response` looks at one response and returns a `Verdict`; checks run in this order and the
first that fires wins:

1. `error`: not a chat completion (an `error` object, no choices). HTTP errors and timeouts
   never reach `classify_response`; the harness builds them with `Verdict.error`.
2. `leaked_markup`: DSML or tool-call markup in `content` or `reasoning_content` (full-width
   `｜DSML｜` and ASCII `|DSML|` in any tag, `<invoke name=`, `</invoke>`,
   `<parameter name=`, `<function_calls>` / `<tool_calls>` blocks, special tokens such as
   `<｜end▁of▁sentence｜>` or `<|im_end|>`, and `<think>` tags in `content`), or DSML / special
   tokens / tool-call tags inside a tool call's arguments.
3. `malformed_call`: a tool call that is not an object with `function.name` and a string
   `function.arguments`, an unknown tool, arguments that are not a JSON object, or arguments
   that violate the tool's JSON schema (jsonschema Draft 2020-12, as sglang's V4 detector;
   `leak.arguments` gets its verdict without running it on most valid arguments).
4. `degenerate`: repetition loops and tag soup (`leak.degenerate`) in the text fields or in long
   string arguments, or the same call (name and arguments) three or more times in one response.
5. `missing_call`: `must_call` and no tool call.

Markup patterns live in `leak.markup`, the degenerate heuristic in `leak.degenerate`, and
streams are assembled by `leak.sse` first.
"""

from __future__ import annotations

import json
import marshal
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsv4_operator.leak.arguments import ArgumentSchema, InvalidSchema
from dsv4_operator.leak.degenerate import degenerate_reason, utf8
from dsv4_operator.leak.markup import find_markup
from dsv4_operator.leak.verdict import SNIPPET_CHARS, Verdict, VerdictKind, snippet


class InvalidToolSchema(ValueError):
    """A tool offered to the model has no name or an invalid JSON schema (a caller bug)."""


@dataclass(frozen=True)
class _ToolSet:
    validators: Mapping[str, ArgumentSchema]


def _compile_tools(tools: Sequence[Mapping[str, Any]]) -> _ToolSet:
    validators: dict[str, ArgumentSchema] = {}
    for tool in tools:
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidToolSchema(f"tool without function.name: {json.dumps(tool)[:200]}")
        schema = function.get("parameters") or {"type": "object"}
        try:
            validators[function["name"]] = ArgumentSchema(schema)
        except InvalidSchema as error:
            raise InvalidToolSchema(
                f"tool {function['name']!r} has an invalid JSON schema: {error}"
            ) from error
    return _ToolSet(validators)


_TOOLSETS: dict[bytes | str, _ToolSet] = {}
_TOOLSETS_KEPT = 64


def _toolset(tools: Sequence[Mapping[str, Any]]) -> _ToolSet:
    # Keyed by the tools' marshal bytes: they are JSON data (a parsed request, the spec's),
    # and version 2 (no back-references, so equal data gives equal bytes whatever else holds
    # it) writes them back exactly, at under half the cost of `repr` or `json.dumps` on every
    # response. Data marshal cannot write (a Mapping that is not a dict) falls to `repr`.
    try:
        key: bytes | str = marshal.dumps(tools, 2)  # type: ignore[arg-type]  # JSON data
    except ValueError:
        key = repr(tools)
    toolset = _TOOLSETS.get(key)
    if toolset is None:
        if len(_TOOLSETS) >= _TOOLSETS_KEPT:
            _TOOLSETS.clear()
        toolset = _TOOLSETS[key] = _compile_tools(tools)
    return toolset


def _check_call(call: Any, toolset: _ToolSet) -> Verdict | dict[str, Any]:
    """The verdict on a broken or leaking call, else its arguments parsed (parsed once)."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return Verdict(
            VerdictKind.MALFORMED_CALL,
            "tool call without a function object",
            snippet(json.dumps(call, ensure_ascii=False)),
        )
    function = call["function"]
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        return Verdict(VerdictKind.MALFORMED_CALL, "tool call without a function name")
    if not isinstance(arguments, str):
        return Verdict(
            VerdictKind.MALFORMED_CALL,
            f"arguments of {name} are not a JSON string",
            snippet(json.dumps(arguments, ensure_ascii=False)),
        )
    markup = find_markup(arguments, content=False)
    if markup is not None:
        return Verdict(
            VerdictKind.LEAKED_MARKUP,
            f"{markup[0]} inside the arguments of {name}",
            snippet(arguments, markup[1]),
        )
    parsed: Any = None
    parse_error: json.JSONDecodeError | None = None
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as error:
        parse_error = error
    for value in _strings(parsed):  # markup inside a JSON string ("\uff5cDSML\uff5c" too)
        markup = find_markup(value, content=False)
        if markup is not None:
            return Verdict(
                VerdictKind.LEAKED_MARKUP,
                f"{markup[0]} inside the arguments of {name}",
                snippet(value, markup[1]),
            )
    validator = toolset.validators.get(name)
    if validator is None:
        return Verdict(VerdictKind.MALFORMED_CALL, f"unknown tool {name!r}", name[:SNIPPET_CHARS])
    if parse_error is not None:
        return Verdict(
            VerdictKind.MALFORMED_CALL,
            f"arguments of {name} are not valid JSON: {parse_error.msg} at char {parse_error.pos}",
            snippet(arguments, parse_error.pos),
        )
    if not isinstance(parsed, dict):
        return Verdict(
            VerdictKind.MALFORMED_CALL,
            f"arguments of {name} are not a JSON object",
            snippet(arguments),
        )
    problem = validator.problem(parsed)
    if problem is not None:
        where = "/".join(str(p) for p in problem.absolute_path) or "(root)"
        return Verdict(
            VerdictKind.MALFORMED_CALL,
            f"arguments of {name} violate its schema at {where}: {problem.message}"[:300],
            snippet(arguments),
        )
    return parsed


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


# --- classify_response ----------------------------------------------------------------------


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: [{"type": "text", "text": ...}]
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, Mapping))
    return str(value)


def classify_response(
    response: Mapping[str, Any], *, tools: Sequence[Mapping[str, Any]], must_call: bool
) -> Verdict:
    """Classify one non-streaming chat-completion response (first choice).

    `tools` are the OpenAI tool definitions offered in the request (their `parameters` schemas
    validate the arguments); `must_call` says the turn had to call a tool. Streams go through
    `assemble_stream` first. Raises `InvalidToolSchema` for a broken tool definition.
    """
    toolset = _toolset(tools)
    if "error" in response or response.get("object") == "error":
        detail = response.get("error", response.get("message", response))
        return Verdict.error(
            "the server returned an error object", json.dumps(detail, ensure_ascii=False)
        )
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return Verdict.error("not a chat completion: no choices", json.dumps(response)[:200])
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        return Verdict.error("not a chat completion: no message", json.dumps(choices[0])[:200])

    content = _text(message.get("content"))
    reasoning = _text(message.get("reasoning_content"))
    # Each text's UTF-8 made once, for the markup needles and the degenerate rules' byte checks.
    texts = (
        ("content", content, utf8(content)),
        ("reasoning_content", reasoning, utf8(reasoning)),
    )
    for field, text, data in texts:
        markup = find_markup(text, content=field == "content", utf8=data)
        if markup is not None:
            return Verdict(
                VerdictKind.LEAKED_MARKUP, f"{markup[0]} in {field}", snippet(text, markup[1])
            )

    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        return Verdict(VerdictKind.MALFORMED_CALL, "tool_calls is not a list", snippet(str(calls)))
    parsed_arguments: list[tuple[str, dict[str, Any]]] = []
    for call in calls:
        checked = _check_call(call, toolset)
        if isinstance(checked, Verdict):
            return checked
        parsed_arguments.append((call["function"]["name"], checked))

    for field, text, data in texts:
        found = degenerate_reason(text, data)
        if found is not None:
            return Verdict(
                VerdictKind.DEGENERATE, f"{found[0]} in {field}", snippet(text, found[1])
            )
    # The same call three times needs three calls: most responses skip the count.
    signatures = (
        Counter((c["function"]["name"], c["function"]["arguments"]) for c in calls).most_common(1)
        if len(calls) >= 3
        else []
    )
    if signatures and signatures[0][1] >= 3:
        (name, arguments), times = signatures[0]
        return Verdict(
            VerdictKind.DEGENERATE,
            f"the same call to {name} {times} times in one response",
            snippet(arguments),
        )
    for name, parsed in parsed_arguments:
        for value in _strings(parsed):
            found = degenerate_reason(value)
            if found is not None:
                return Verdict(
                    VerdictKind.DEGENERATE,
                    f"{found[0]} in an argument of {name}",
                    snippet(value, found[1]),
                )

    if must_call and not calls:
        finish = choices[0].get("finish_reason")
        return Verdict(
            VerdictKind.MISSING_CALL,
            f"no tool call (finish_reason {finish!r})",
            snippet(content or reasoning),
        )
    return Verdict.ok()

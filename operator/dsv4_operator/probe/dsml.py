"""DSML detector: classify one OpenAI chat-completion response as ok or as a kind of leak.

A DSML-parsing SGLang (`--tool-call-parser deepseekv4`) turns the model's
`<｜DSML｜tool_calls>` block into structured `tool_calls`. When parsing fails, the markup is
returned as `content` with `tool_calls: null` and `finish_reason: "stop"` (reference section 5.3).
`classify` looks at one response and returns a `Verdict`; checks run in this order and the
first that fires wins:

1. `error`: not a chat completion (an `error` object, no choices). HTTP errors and timeouts
   never reach `classify`; the harness builds them with `Verdict.error`.
2. `leaked_markup`: DSML or tool-call markup in `content` or `reasoning_content` (full-width
   `｜DSML｜` and ASCII `|DSML|` in any tag, `<invoke name=`, `</invoke>`,
   `<parameter name=`, `<function_calls>` / `<tool_calls>` blocks, special tokens such as
   `<｜end▁of▁sentence｜>` or `<|im_end|>`, and `<think>` tags in `content`), or DSML / special
   tokens / tool-call tags inside a tool call's arguments.
3. `malformed_call`: a tool call that is not an object with `function.name` and a string
   `function.arguments`, an unknown tool, arguments that are not a JSON object, or arguments
   that violate the tool's JSON schema (jsonschema Draft 2020-12, as sglang's V4 detector).
4. `degenerate`: repetition loops and tag soup (heuristic below) in the text fields or in long
   string arguments, or the same call (name and arguments) three or more times in one response.
5. `missing_call`: `must_call` and no tool call.

Degenerate heuristic (each rule looks at one text; a text shorter than 24 characters is skipped):

- tail loop: the text ends in a periodic run, period 2..100 characters, at least 3 periods and
  48 characters long, whose unit holds a letter (a model stuck in a loop runs to max_tokens);
- repeated segment: the same line or sentence (>= 8 characters, with a letter) three or more
  times in a row anywhere;
- low diversity: at least 60 word/punctuation tokens and fewer than 40% distinct 4-grams;
- tag soup: at least 6 tag-like fragments (`<x ...>`, `</x>`, `attr="v">`) covering at least
  60% of the non-space characters;
- garbage: three or more U+FFFD replacement, control (other than tab/newline/CR) or
  private-use characters.

Its false-positive rate on normal prose is measured by `bench/detector.py` and pinned by
`tests/unit/test_dsml.py`. Token salad without any repetition, markup or garbage characters is
not detected (no language model here); such a turn still fails as `missing_call`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

SNIPPET_CHARS = 200
_SNIPPET_LEAD = 40


class VerdictKind(StrEnum):
    """What the detector concluded about one response."""

    OK = "ok"
    LEAKED_MARKUP = "leaked_markup"
    MALFORMED_CALL = "malformed_call"
    MISSING_CALL = "missing_call"
    DEGENERATE = "degenerate"
    ERROR = "error"

    @property
    def is_leak(self) -> bool:
        """True for the kinds that count as a corrupted response."""
        return self in LEAK_KINDS


LEAK_KINDS = frozenset(
    {
        VerdictKind.LEAKED_MARKUP,
        VerdictKind.MALFORMED_CALL,
        VerdictKind.MISSING_CALL,
        VerdictKind.DEGENERATE,
    }
)


@dataclass(frozen=True)
class Verdict:
    """One classification: its kind, a short reason, and up to 200 chars of offending text."""

    kind: VerdictKind
    reason: str
    snippet: str = ""

    @property
    def leak(self) -> bool:
        return self.kind.is_leak

    @classmethod
    def ok(cls) -> Verdict:
        return cls(VerdictKind.OK, "well-formed")

    @classmethod
    def error(cls, reason: str, snippet: str = "") -> Verdict:
        """An HTTP error, timeout or transport failure (built by the harness)."""
        return cls(VerdictKind.ERROR, reason, snippet[:SNIPPET_CHARS])

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind.value, "reason": self.reason, "snippet": self.snippet}


class InvalidToolSchema(ValueError):
    """A tool offered to the model has no name or an invalid JSON schema (a caller bug)."""


class StreamError(ValueError):
    """An SSE stream that cannot be assembled (bad JSON in a `data:` line)."""


class IncompleteStream(StreamError):
    """The SSE stream ended without `data: [DONE]`."""


# --- markup ---------------------------------------------------------------------------------

# Full-width `｜DSML｜` anywhere; the ASCII form only as a tag (`<|DSML|`, `</|DSML|`) or glued
# to a DSML tag name, so that a markdown table cell "| DSML |" is not a leak.
_DSML_TOKEN = re.compile(
    r"｜DSML[｜|]|\|DSML｜|</?\|DSML\||\|DSML\|(?:invoke|parameter|tool_calls|function_calls)"
)
# <｜end▁of▁sentence｜>, <｜tool▁calls▁begin｜>, <|im_end|>, <|endoftext|> ...
_SPECIAL_TOKEN = re.compile(r"<[｜|][^<>｜|\n]{1,48}[｜|]>")
_TOOL_TAG = re.compile(
    r"<\s*invoke\b|</\s*invoke\s*>|<\s*parameter\s+name\s*=|</\s*parameter\s*>"
    r"|</?\s*(?:function_calls|function_call|tool_calls|tool_call)\s*>",
    re.IGNORECASE,
)
_THINK_TAG = re.compile(r"</?think>")

_MARKUP_CHECKS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("DSML markup", _DSML_TOKEN),
    ("special token", _SPECIAL_TOKEN),
    ("tool-call markup", _TOOL_TAG),
)


def _snippet(text: str, start: int = 0) -> str:
    begin = max(0, start - _SNIPPET_LEAD)
    return text[begin : begin + SNIPPET_CHARS]


def find_markup(text: str, *, content: bool = True) -> tuple[str, int] | None:
    """The first markup kind in `text` and where it starts, or None.

    `content=True` also flags `<think>` tags, which the reasoning parser strips from content.
    """
    found: tuple[int, str] | None = None
    checks = _MARKUP_CHECKS + ((("think tag", _THINK_TAG),) if content else ())
    for name, pattern in checks:
        match = pattern.search(text)
        if match and (found is None or match.start() < found[0]):
            found = (match.start(), name)
    return None if found is None else (found[1], found[0])


# --- degenerate text ------------------------------------------------------------------------

_MIN_TEXT = 24
_LOOP_MIN_CHARS, _LOOP_MIN_PERIODS, _LOOP_MAX_PERIOD = 48, 3, 100
_SEGMENT_MIN_CHARS, _SEGMENT_REPEATS = 8, 3
_NGRAM, _NGRAM_MIN_TOKENS, _NGRAM_MIN_DISTINCT = 4, 60, 0.40
_TAG_MIN, _TAG_MIN_SHARE = 6, 0.60
_GARBAGE_MIN = 3

_LETTER = re.compile(r"[^\W\d_]")
_TOKEN = re.compile(r"\w+|[^\w\s]+")
_SEGMENT = re.compile(r"[^\n.!?。！？]+[.!?。！？]*")
_TAG_FRAGMENT = re.compile(
    r"</?[A-Za-z_][\w:.-]*(?:\s[^<>]{0,80})?/?>|\w+\s*=\s*\"[^\"<>]*\"\s*/?>"
)


def _tail_loop(text: str) -> tuple[int, str] | None:
    n = len(text)
    for period in range(2, min(_LOOP_MAX_PERIOD, n // _LOOP_MIN_PERIODS) + 1):
        span = max(_LOOP_MIN_PERIODS * period, _LOOP_MIN_CHARS)
        if span > n:
            break
        tail = text[n - span :]
        if tail[period:] == tail[:-period]:  # the last `span` chars are `period`-periodic
            unit = text[n - period :]
            if _LETTER.search(unit):
                # Extend backwards to report where the loop starts.
                start = n - span
                while start > 0 and text[start - 1] == text[start - 1 + period]:
                    start -= 1
                return start, f"repetition loop of a {period}-char unit to the end of the text"
    return None


def _repeated_segment(text: str) -> tuple[int, str] | None:
    run, previous, run_start = 1, "", 0
    for match in _SEGMENT.finditer(text):
        segment = match.group().strip()
        if len(segment) < _SEGMENT_MIN_CHARS or not _LETTER.search(segment):
            run, previous = 1, ""
        elif segment == previous:
            run += 1
            if run >= _SEGMENT_REPEATS:
                return run_start, f"the same segment {run} times in a row"
        else:
            run, previous, run_start = 1, segment, match.start()
    return None


def _low_diversity(text: str) -> tuple[int, str] | None:
    tokens = _TOKEN.findall(text)
    if len(tokens) < _NGRAM_MIN_TOKENS:
        return None
    grams = [tuple(tokens[i : i + _NGRAM]) for i in range(len(tokens) - _NGRAM + 1)]
    counts = Counter(grams)
    distinct = len(counts) / len(grams)
    if distinct >= _NGRAM_MIN_DISTINCT:
        return None
    top = " ".join(counts.most_common(1)[0][0])
    return max(0, text.find(top)), f"low diversity: {distinct:.0%} distinct {_NGRAM}-grams"


def _tag_soup(text: str) -> tuple[int, str] | None:
    fragments = list(_TAG_FRAGMENT.finditer(text))
    if len(fragments) < _TAG_MIN:
        return None
    covered = sum(len(re.sub(r"\s", "", m.group())) for m in fragments)
    total = len(re.sub(r"\s", "", text))
    if total == 0 or covered / total < _TAG_MIN_SHARE:
        return None
    return fragments[0].start(), f"tag soup: {len(fragments)} tag fragments"


def _garbage(text: str) -> tuple[int, str] | None:
    positions = [
        i
        for i, ch in enumerate(text)
        if ch == "\ufffd" or (unicodedata.category(ch) in ("Cc", "Co") and ch not in "\t\n\r")
    ]
    if len(positions) < _GARBAGE_MIN:
        return None
    return positions[0], f"{len(positions)} replacement/control characters"


_DEGENERATE_RULES = (_tail_loop, _repeated_segment, _low_diversity, _tag_soup, _garbage)


def degenerate_reason(text: str) -> tuple[str, int] | None:
    """Why `text` looks degenerate (and where), or None for text that looks normal."""
    if len(text) < _MIN_TEXT:
        return None
    for rule in _DEGENERATE_RULES:
        found = rule(text)
        if found is not None:
            return found[1], found[0]
    return None


# --- tools ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ToolSet:
    validators: Mapping[str, Draft202012Validator]


def _compile_tools(tools: Sequence[Mapping[str, Any]]) -> _ToolSet:
    validators: dict[str, Draft202012Validator] = {}
    for tool in tools:
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidToolSchema(f"tool without function.name: {json.dumps(tool)[:200]}")
        schema = function.get("parameters") or {"type": "object"}
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as error:
            raise InvalidToolSchema(
                f"tool {function['name']!r} has an invalid JSON schema: {error.message}"
            ) from error
        validators[function["name"]] = Draft202012Validator(schema)
    return _ToolSet(validators)


@lru_cache(maxsize=64)
def _cached_tools(key: str) -> _ToolSet:
    tools: list[Mapping[str, Any]] = json.loads(key)
    return _compile_tools(tools)


def _toolset(tools: Sequence[Mapping[str, Any]]) -> _ToolSet:
    return _cached_tools(json.dumps(list(tools), sort_keys=True))


def _check_call(call: Any, toolset: _ToolSet) -> Verdict | None:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return Verdict(
            VerdictKind.MALFORMED_CALL,
            "tool call without a function object",
            _snippet(json.dumps(call, ensure_ascii=False)),
        )
    function = call["function"]
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        return Verdict(VerdictKind.MALFORMED_CALL, "tool call without a function name")
    if not isinstance(arguments, str):
        return Verdict(
            VerdictKind.MALFORMED_CALL,
            f"arguments of {name} are not a JSON string",
            _snippet(json.dumps(arguments, ensure_ascii=False)),
        )
    markup = find_markup(arguments, content=False)
    if markup is not None:
        return Verdict(
            VerdictKind.LEAKED_MARKUP,
            f"{markup[0]} inside the arguments of {name}",
            _snippet(arguments, markup[1]),
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
                _snippet(value, markup[1]),
            )
    validator = toolset.validators.get(name)
    if validator is None:
        return Verdict(VerdictKind.MALFORMED_CALL, f"unknown tool {name!r}", name[:SNIPPET_CHARS])
    if parse_error is not None:
        return Verdict(
            VerdictKind.MALFORMED_CALL,
            f"arguments of {name} are not valid JSON: {parse_error.msg} at char {parse_error.pos}",
            _snippet(arguments, parse_error.pos),
        )
    if not isinstance(parsed, dict):
        return Verdict(
            VerdictKind.MALFORMED_CALL,
            f"arguments of {name} are not a JSON object",
            _snippet(arguments),
        )
    problem = best_match(validator.iter_errors(parsed))
    if problem is not None:
        where = "/".join(str(p) for p in problem.absolute_path) or "(root)"
        return Verdict(
            VerdictKind.MALFORMED_CALL,
            f"arguments of {name} violate its schema at {where}: {problem.message}"[:300],
            _snippet(arguments),
        )
    return None


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


# --- classify -------------------------------------------------------------------------------


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: [{"type": "text", "text": ...}]
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, Mapping))
    return str(value)


def classify(
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
    for field, text, is_content in (
        ("content", content, True),
        ("reasoning_content", reasoning, False),
    ):
        markup = find_markup(text, content=is_content)
        if markup is not None:
            return Verdict(
                VerdictKind.LEAKED_MARKUP, f"{markup[0]} in {field}", _snippet(text, markup[1])
            )

    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        return Verdict(VerdictKind.MALFORMED_CALL, "tool_calls is not a list", _snippet(str(calls)))
    for call in calls:
        problem = _check_call(call, toolset)
        if problem is not None:
            return problem

    for field, text in (("content", content), ("reasoning_content", reasoning)):
        found = degenerate_reason(text)
        if found is not None:
            return Verdict(
                VerdictKind.DEGENERATE, f"{found[0]} in {field}", _snippet(text, found[1])
            )
    signatures = Counter(
        (c["function"]["name"], c["function"]["arguments"]) for c in calls
    ).most_common(1)
    if signatures and signatures[0][1] >= 3:
        (name, arguments), times = signatures[0]
        return Verdict(
            VerdictKind.DEGENERATE,
            f"the same call to {name} {times} times in one response",
            _snippet(arguments),
        )
    for call in calls:
        for value in _strings(json.loads(call["function"]["arguments"])):
            found = degenerate_reason(value)
            if found is not None:
                name = call["function"]["name"]
                return Verdict(
                    VerdictKind.DEGENERATE,
                    f"{found[0]} in an argument of {name}",
                    _snippet(value, found[1]),
                )

    if must_call and not calls:
        finish = choices[0].get("finish_reason")
        return Verdict(
            VerdictKind.MISSING_CALL,
            f"no tool call (finish_reason {finish!r})",
            _snippet(content or reasoning),
        )
    return Verdict.ok()


# --- SSE ------------------------------------------------------------------------------------

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

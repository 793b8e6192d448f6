"""What the release the double runs as answers for a model output (outputs.py): the parse of a
DeepSeek-V4 `/v1/chat/completions` answer as each release's own code does it for a DSV4Deployment
(`--tool-call-parser deepseekv4`, `--reasoning-parser deepseek-v4`, a loaded tokenizer).

- 0.5.16 (the incident's base): `DeepSeekV4Detector.detect_and_parse`
  (sglang/srt/function_call/deepseekv32_detector.py), reached through serving_chat's
  `_process_tool_calls` when the text holds DSML. Text without `<｜DSML｜tool_calls>` (a bare
  invoke, the V3.2 `function_calls` name) comes back whole as `content`; a section that never
  closes is dropped silently (the prose before it only); an invoke body that is not JSON raises,
  and the except branch returns the whole text, markup and all, as `content` (`Error in
  detect_and_parse: ...`); parameters are stripped, non-string ones read as JSON (else kept as
  strings); a call to a tool the request did not offer is dropped by `parse_base_json` (`Model
  attempted to call undefined function: ...`); an invoke without a name is skipped.
- 0.5.23: deepseek-recipe (`DeepSeekRecipeOutputParser`, sglang/srt/parser/
  deepseek_recipe_output.py, chosen in entrypoints/openai/chat_encoding_adapters.py and used by
  serving_deepseek_recipe.py's `parse_chat_response` and `stream_chat_chunks`), token by token,
  streamed or not. It returns every named invoke as a call, in or out of a section, closed or
  not: arguments are built as it reads them (`{"key": "value", ...}`, a non-string value
  verbatim, `}` only when the invoke closes, so a cut-off invoke has cut-off arguments), a
  direct-JSON body gives `{}`, a tool the request did not offer is returned too; the prose
  before the DSML is the content; a DSML fragment after text is dropped with the line break
  before it; text whose last character it decodes as U+FFFD (an unfinished one, as far as it
  can tell) is held, and dropped when the output ends: for a whole response, all of it. It
  drops a call silently only when it cannot read one: a section with no named invoke, an invoke
  without a name. It logs nothing. 0.5.23's fail-closed detector runs only for a DSML parser
  without a recipe adapter (`deepseekv32`, which DSV4-R014 refuses for V4), and a
  `--skip-tokenizer-init` server has no text for it: no DSV4Deployment's chat reaches it, so
  the double does not model it.

Both: `finish_reason` "tool_calls" when a call came back and generation stopped on its own,
else the generation's own. With `toolCallDropCounter` (the image's patch 0002) each response
parsed while the request offered tools is counted in `sglang:dsv4_tool_call_responses_total`
and one with a dropped call in `sglang:dsv4_tool_call_drops_total{reason}`, with the patch's
log lines. tests/conformance/test_engine_double.py checks all of it against each wheel.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsv4_engine_double.config import DoubleConfig
from dsv4_engine_double.outputs import Generated, Invoke, Output, Param
from dsv4_engine_double.shapes import Shape, Tools, tool_call, tool_names

UNTERMINATED_WARNING = "Dropping unterminated DeepSeek tool-call section"
REPLACEMENT_CHARACTER = "\ufffd"
WARNING, ERROR = "WARNING", "ERROR"
LogLine = tuple[str, str]  # (level, message)
# What a parser gives: content, calls as (name, arguments), drop reason, log lines.
Result = tuple[str, tuple[tuple[str, str], ...], str | None, tuple[LogLine, ...]]

# The answer's shape per output and release; None: a well-formed answer.
DETECTOR_ANSWERS: dict[Generated, Shape | None] = {
    Generated.BROKEN_JSON_BODY: Shape.DSML_BLOCK,
    Generated.BARE_INVOKE: Shape.BARE_INVOKE,
    Generated.V32_SECTION: Shape.V32_BLOCK_NAME,
    Generated.UNCLOSED_SECTION: Shape.DROPPED,
    Generated.CUT_IN_VALUE: Shape.DROPPED,
    Generated.STRIPPED_DSML: Shape.STRIPPED_DSML,
    Generated.TAG_SOUP: Shape.TAG_SOUP,
    Generated.ATTRIBUTE_SOUP: Shape.ATTRIBUTE_SOUP,
    Generated.REPETITION: Shape.REPETITION,
    Generated.GARBLED: Shape.GARBLED,
    Generated.PROSE_ONLY: Shape.PROSE_ONLY,
    Generated.EOS_IN_PROSE: Shape.SPECIAL_TOKEN,
    Generated.LOOPED_ARGUMENT: Shape.DEGENERATE_ARGS,
    Generated.UNKNOWN_TOOL: Shape.DROPPED,
    Generated.SCHEMA_VIOLATION: Shape.SCHEMA_VIOLATION,
    Generated.REPEATED_CALLS: Shape.REPEATED_CALLS,
    Generated.OPEN_SECTION: Shape.DROPPED,
    Generated.NAMELESS_SECTION: Shape.DROPPED,
    Generated.NAMELESS_INVOKE: Shape.BARE_INVOKE,
}
RECIPE_ANSWERS: dict[Generated, Shape | None] = {
    **DETECTOR_ANSWERS,
    Generated.BROKEN_JSON_BODY: Shape.EMPTY_ARGS,
    Generated.BARE_INVOKE: None,
    Generated.V32_SECTION: None,
    Generated.UNCLOSED_SECTION: None,
    Generated.CUT_IN_VALUE: Shape.BAD_JSON_ARGS,
    Generated.UNKNOWN_TOOL: Shape.UNKNOWN_TOOL,
    Generated.NAMELESS_INVOKE: Shape.DROPPED,
}


@dataclass(frozen=True)
class Parsed:
    """A release's answer to one output, what its patched image counts, and what it logs."""

    shape: Shape | None  # None: a well-formed answer
    content: str
    calls: tuple[tuple[str, str], ...]  # (name, arguments)
    finish: str
    drop_reason: str | None  # sglang:dsv4_tool_call_drops_total's reason, if a call was dropped
    logs: tuple[LogLine, ...] = ()


def message(parsed: Parsed, rng: random.Random) -> dict[str, Any]:
    """The assistant message the double sends for `parsed` (call ids drawn from `rng`; empty
    content as null, as in all of the double's answers)."""
    calls = [tool_call(name, arguments, rng) for name, arguments in parsed.calls]
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls or None}


def offers_tools(body: Mapping[str, Any]) -> bool:
    """Whether the request's output runs through the tool-call parser."""
    return bool(body.get("tools")) and body.get("tool_choice", "auto") != "none"


def answers(config: DoubleConfig) -> dict[Generated, Shape | None]:
    """The shape of the answer the release `config` runs as gives each output."""
    return RECIPE_ANSWERS if config.parses_with_recipe else DETECTOR_ANSWERS


def parse(config: DoubleConfig, output: Output, tools: Tools) -> Parsed:
    """The release's answer to `output` for a request that offered `tools`."""
    patched = "toolCallDropCounter" in config.capabilities
    if config.parses_with_recipe:
        content, calls, reason, logs = _recipe(output, patched)
    else:
        content, calls, reason, logs = _detector(output, tool_names(tools), patched)
    finish = "tool_calls" if calls and output.finish == "stop" else output.finish
    shape = answers(config)[output.kind]
    if output.text and not content:
        shape = Shape.EMPTY
    return Parsed(shape, content, calls, finish, reason, logs)


# --- 0.5.16: DeepSeekV4Detector.detect_and_parse ---------------------------------------------


def _detector(output: Output, offered: list[str], patched: bool) -> Result:
    text = output.render()
    if output.text is not None or output.block != "tool_calls":
        return text, (), None, ()  # no `<｜DSML｜tool_calls>`: the text as it is
    if not output.section_closed:  # function_calls_regex finds no section
        warning = ((WARNING, UNTERMINATED_WARNING),) if patched else ()
        return output.prose, (), "unterminated_section", warning
    calls: list[tuple[str, str]] = []
    logs: list[LogLine] = []
    for invoke in output.invokes:
        if invoke.name is None:
            continue  # invoke_regex needs a name
        try:
            arguments = _detector_arguments(invoke)
        except ValueError as error:  # the except branch: the whole text, markup and all
            return text, (), "exception", ((ERROR, f"Error in detect_and_parse: {error}"),)
        if invoke.name not in offered:  # parse_base_json
            logs.append((WARNING, f"Model attempted to call undefined function: {invoke.name}"))
            continue
        calls.append((invoke.name, arguments))
    reason = None
    if any(invoke.name is None for invoke in output.invokes):
        reason = "unclosed"
        if patched:
            logs.append((WARNING, "Dropping unclosed DeepSeek invoke without a name"))
    return output.prose, tuple(calls), reason, tuple(logs)


def _detector_arguments(invoke: Invoke) -> str:
    """`_parse_parameters_from_xml` then `json.loads` and parse_base_json's `json.dumps`."""
    body = (invoke.body or "").strip()
    if body.startswith("{") and body.endswith("}"):
        return json.dumps(json.loads(body) or {}, ensure_ascii=False)  # raises on broken JSON
    return json.dumps({p.name: _detector_value(p) for p in invoke.params}, ensure_ascii=False)


def _detector_value(param: Param) -> Any:
    value = param.raw.strip()
    if param.string:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


# --- 0.5.23: deepseek-recipe's DeepSeekRecipeOutputParser -----------------------------------


def _recipe(output: Output, patched: bool) -> Result:
    if output.text is not None:
        if not output.stray and output.text.endswith(REPLACEMENT_CHARACTER):
            return "", (), None, ()  # held as an unfinished character, then dropped
        return output.text, (), None, ()  # a stray DSML fragment after the text is dropped
    calls = tuple(
        (invoke.name, _recipe_arguments(invoke))
        for invoke in output.invokes
        if invoke.name is not None
    )
    reason = _recipe_drop(output, len(calls))
    logs: tuple[LogLine, ...] = ()
    if patched and reason is not None:
        logs = ((WARNING, _recipe_drop_line(reason, len(calls), len(output.invokes))),)
    return output.prose, calls, reason, logs


def _recipe_arguments(invoke: Invoke) -> str:
    """The JSON recipe streams while it reads the invoke, up to where the output ends."""
    if invoke.body is not None:
        return "{}"  # recipe reads parameter tags only
    pieces = [f"{json.dumps(p.name)}: {_recipe_value(p.raw, p.string)}" for p in invoke.params]
    if invoke.cut is not None:
        last = invoke.params[-1]
        partial = last.raw[: invoke.cut]
        value = json.dumps(partial, ensure_ascii=False)[:-1] if last.string else partial
        pieces[-1] = f"{json.dumps(last.name)}: {value}"
    if not pieces:
        return "{}" if invoke.closed else ""
    return "{" + ", ".join(pieces) + ("}" if invoke.closed else "")


def _recipe_value(raw: str, string: bool) -> str:
    return json.dumps(raw, ensure_ascii=False) if string else raw


def _recipe_drop(output: Output, calls: int) -> str | None:
    """The patch's `output_drop`: fewer calls than invokes, or a section that gave none."""
    section = output.block is not None
    if calls >= len(output.invokes) and not (section and calls == 0):
        return None
    if section and not output.section_closed:
        return "unterminated_section"
    if not all(invoke.closed for invoke in output.invokes):
        return "unclosed"
    return "malformed"


def _recipe_drop_line(reason: str, calls: int, invokes: int) -> str:
    if reason == "unterminated_section":
        return UNTERMINATED_WARNING
    if reason == "unclosed":
        return "Dropping unclosed DeepSeek invoke"
    return f"Dropping malformed DeepSeek invoke: {calls} call(s) parsed from {invokes} invoke(s)"

"""Runs INSIDE a release's conformance environment: its DeepSeek-V4 tool-call parsers on crafted
outputs, and what each parse returned and counted.

stdin: {"cases": [{"id", "path": "detector" | "recipe", "stream": bool, "chunks": [str],
"fault": bool, and optionally "tools": [OpenAI tool], "finish": "stop" | "length", "logs":
bool}]}; stdout: {id: {"calls", "text", "counted"} and, with "logs", the WARNING and ERROR
records sglang's loggers emitted during the case as [level, message]}. `counted` is the change
of `sglang:dsv4_tool_call_responses_total` and of each `sglang:dsv4_tool_call_drops_total{reason}`
in this process's Prometheus registry (null where the sglang on sys.path is unpatched). The
tests run this twice, on the wheel and on a patched copy of it, and compare the two.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Any

from sglang.srt.entrypoints.openai.protocol import Function, Tool
from sglang.srt.function_call.deepseekv4_detector import DeepSeekV4Detector

REASONS = ("unclosed", "malformed", "unterminated_section", "exception")
TOOLS = [
    Tool(
        type="function",
        function=Function(
            name="get_weather",
            parameters={"type": "object", "properties": {"city": {"type": "string"}}},
        ),
    )
]


class _Records(logging.Handler):
    """sglang's WARNING and ERROR records of the current case; each still goes to stderr, as
    the last-resort handler would print it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.case: list[list[str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        sys.stderr.write(message + "\n")
        if record.name.startswith("sglang"):
            self.case.append([record.levelname, message])


def _tools(case: dict[str, Any]) -> list[Tool]:
    if "tools" not in case:
        return TOOLS
    return [Tool(type="function", function=Function(**t["function"])) for t in case["tools"]]


def _counters() -> dict[str, float] | None:
    try:
        from sglang.srt.function_call import dsv4_tool_call_metrics  # noqa: F401
    except ImportError:
        return None  # the unpatched wheel
    from prometheus_client import REGISTRY

    def value(name: str, labels: dict[str, str] | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    counts = {"responses": value("sglang:dsv4_tool_call_responses_total")}
    for reason in REASONS:
        counts[reason] = value("sglang:dsv4_tool_call_drops_total", {"reason": reason})
    return counts


def _delta(before: dict[str, float] | None, after: dict[str, float] | None) -> Any:
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def _fault(detector: DeepSeekV4Detector) -> None:
    """An exception inside the parser's try (not the ValueError it drops an invoke for)."""

    def broken(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("injected parser fault")

    detector._parse_parameters_from_xml = broken


def _detector(case: dict[str, Any]) -> tuple[list[list[Any]], str]:
    detector = DeepSeekV4Detector()
    tools = _tools(case)
    if case.get("fault"):
        _fault(detector)
    if not case["stream"]:
        result = detector.detect_and_parse("".join(case["chunks"]), tools)
        return [[c.name, c.parameters] for c in result.calls], result.normal_text
    calls: list[list[Any]] = []
    text = ""
    results = [detector.parse_streaming_increment(chunk, tools) for chunk in case["chunks"]]
    if hasattr(detector, "finish"):  # 0.5.23: serving_chat flushes at the stream's end
        results.append(detector.finish(tools))
    for result in results:
        text += result.normal_text or ""
        calls += [[c.tool_index, c.name, c.parameters] for c in result.calls]
    finish_response = getattr(detector, "dsv4_finish_response", None)
    if finish_response is not None:  # 0.5.16 patched: serving_chat calls it at the stream's end
        finish_response()
    return calls, text


@functools.cache
def _recipe_tokenizer() -> Any:
    """A tiny byte-level tokenizer with recipe's special tokens (one id each), and the recipe
    built on it."""
    import deepseek_recipe
    from sglang.srt.parser.deepseek_recipe_renderer import DeepSeekRecipe
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = deepseek_recipe.SpecialToken
    tokenizer.add_special_tokens(
        [
            getattr(special, name).default_str()
            for name in ("Bos", "Eos", "ThinkingStart", "ThinkingEnd", "User", "Assistant", "Dsml")
        ]
        + ["<｜deepseek_image｜>"]
    )
    return tokenizer, DeepSeekRecipe("dsv4", tokenizer)


def _recipe(case: dict[str, Any]) -> tuple[list[list[Any]], str]:
    """deepseek-recipe's token-level parser (0.5.23's chat path for DeepSeek-V4, a request
    without thinking), fed the ids `_recipe_tokenizer` gives the text, then the generation's
    finish."""
    from sglang.srt.parser.deepseek_recipe_output import DeepSeekRecipeOutputParser

    tokenizer, recipe = _recipe_tokenizer()
    parser = DeepSeekRecipeOutputParser(recipe, thinking_stage=None, parse_tool_calls=True)
    chunks = [tokenizer.encode(c, add_special_tokens=False).ids for c in case["chunks"]]
    deltas = [parser.feed(ids) for ids in chunks]
    deltas.append(parser.finish([], {"type": case.get("finish", "stop"), "matched": None}))
    calls = [[p.index, p.name, p.arguments] for d in deltas for p in d.tool_calls]
    return calls, "".join(d.content for d in deltas)


def main() -> None:
    request = json.load(sys.stdin)
    records = _Records()
    logging.getLogger().addHandler(records)
    answer = {}
    for case in request["cases"]:
        records.case = []
        before = _counters()
        calls, text = (_recipe if case["path"] == "recipe" else _detector)(case)
        answer[case["id"]] = {"calls": calls, "text": text, "counted": _delta(before, _counters())}
        if case.get("logs"):
            answer[case["id"]]["logs"] = records.case
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()

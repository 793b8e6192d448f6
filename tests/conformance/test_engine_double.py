"""The engine double answers each corrupted model output as the release it runs as.

Every output kind of testsupport/dsv4_engine_double/outputs.py, drawn for the canary's tools and
for tools with non-string parameters over several seeds, goes through the release's own parser
in its environment (tool_call_check.py): 0.5.16's `DeepSeekV4Detector.detect_and_parse`, 0.5.23's
deepseek-recipe (`DeepSeekRecipeOutputParser`, fed whole and streamed), on the wheel and on the
copy the image's patch step patched (toolCallDropCounter). The double's answer (parsers.py) must
be the wheel's: the content, each call's name and arguments, and the finish_reason serving_chat
gives them ("tool_calls" when a call came back and generation stopped on its own:
`_process_tool_calls` on 0.5.16, serving_deepseek_recipe.py's `parse_chat_response` on 0.5.23);
its counter movements the patched wheel's, its log lines the ones each wheel logs.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest

from dsv4_engine_double import outputs, parsers, shapes
from dsv4_engine_double.config import DoubleConfig
from dsv4_engine_double.metrics import DROP_REASONS, Metrics
from dsv4_operator.canary.scenario import CANARY_TOOLS

from .image_build import tool_call_parses

pytestmark = pytest.mark.conformance

SEEDS = range(6)
# Beside the canary's tools: integer, boolean, array and optional parameters, no required one.
TYPED_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_pods",
            "parameters": {
                "type": "object",
                "properties": {
                    "namespace": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 500},
                    "ready": {"type": "boolean"},
                    "labels": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                },
            },
        },
    }
]
TOOL_SETS = {"canary": CANARY_TOOLS, "typed": TYPED_TOOLS}


@dataclasses.dataclass(frozen=True)
class Draw:
    id: str
    tools: list[dict[str, Any]]
    output: outputs.Output


def _draws() -> list[Draw]:
    found = []
    for tools_name, tools in TOOL_SETS.items():
        for seed in SEEDS:
            for kind in outputs.Generated:
                rng = random.Random(f"{tools_name}:{seed}:{kind}")
                call = shapes.make_call(tools, rng.choice(shapes.tool_names(tools)), rng)
                output = outputs.generate(kind, tools, call, rng)
                found.append(Draw(f"{kind}/{tools_name}/{seed}", tools, output))
    return found


def _cases(version: str, draws: list[Draw]) -> list[dict[str, Any]]:
    path = "recipe" if version == "0.5.23" else "detector"
    cases = []
    for draw in draws:
        text = draw.output.render()
        case = {
            "path": path,
            "tools": draw.tools,
            "finish": draw.output.finish,
            "fault": False,
            "logs": True,
        }
        cases.append({**case, "id": f"{draw.id}/whole", "stream": False, "chunks": [text]})
        if path == "recipe":  # one parser for both: streamed in pieces, it must answer the same
            chunks = text.splitlines(keepends=True)
            cases.append({**case, "id": f"{draw.id}/stream", "stream": True, "chunks": chunks})
    return cases


def _whole_calls(calls: list[list[Any]]) -> list[tuple[str, str]]:
    """Calls as the client assembles them: detect_and_parse's [name, arguments] as they are,
    recipe's streamed [index, name, piece] pieces joined per index."""
    assembled: dict[int, list[str]] = {}
    for call in calls:
        if len(call) == 2:
            assembled[len(assembled)] = [call[0], call[1]]
        elif call[1] is not None:
            assembled[call[0]] = [call[1], call[2]]
        else:
            assembled[call[0]][1] += call[2]
    return [(name, arguments) for name, arguments in assembled.values()]


def _double_counts(config: DoubleConfig, parsed: parsers.Parsed) -> dict[str, float]:
    """What the double's /metrics moves by for one response of a request that offered tools."""
    metrics = Metrics(config)
    metrics.count_tool_call_response(parsed.drop_reason)
    registry = metrics.registry
    counts = {"responses": registry.get_sample_value("sglang:dsv4_tool_call_responses_total")}
    for reason in DROP_REASONS:
        counts[reason] = registry.get_sample_value(
            "sglang:dsv4_tool_call_drops_total", {"reason": reason}
        )
    return {k: v for k, v in counts.items() if v}


def test_the_double_answers_each_corrupted_output_as_the_release_does(
    version: str, tmp_path: Path
) -> None:
    draws = _draws()
    cases = _cases(version, draws)
    wheel, patched = tool_call_parses(version, cases, tmp_path)
    plain = DoubleConfig(sglang_version=version, tool_call_parser="deepseekv4")
    counting = dataclasses.replace(plain, capabilities=frozenset({"toolCallDropCounter"}))
    mismatches = []
    for draw in draws:
        tools = draw.tools
        double, double_patched = (
            parsers.parse(plain, draw.output, tools),
            parsers.parse(counting, draw.output, tools),
        )
        # the patch counts and logs; it changes no answer
        assert dataclasses.replace(double_patched, logs=double.logs) == double, draw.id
        answer = {
            "content": double.content,
            "calls": list(double.calls),
            "finish": double.finish,
            "logs": [list(line) for line in double.logs],
            "patched logs": [list(line) for line in double_patched.logs],
            "counted": _double_counts(counting, double_patched),
        }
        for case_id in (c["id"] for c in cases if c["id"].startswith(f"{draw.id}/")):
            before, after = wheel[case_id], patched[case_id]
            calls = _whole_calls(before["calls"])
            finish = "tool_calls" if calls and draw.output.finish == "stop" else draw.output.finish
            release = {
                "content": before["text"],
                "calls": calls,
                "finish": finish,
                "logs": before["logs"],
                "patched logs": after["logs"],
                "counted": {k: v for k, v in (after["counted"] or {}).items() if v},
            }
            assert _whole_calls(after["calls"]) == calls and after["text"] == before["text"]
            if release != answer:
                mismatches.append((case_id, draw.output.render(), release, answer))
    assert not mismatches, "\n".join(map(repr, mismatches[:5]))


def test_every_output_kind_and_each_drop_reason_is_checked(version: str) -> None:
    """The draws above reach every output kind, every answer shape the release gives, and
    every drop reason its patched image counts (all but `exception` on 0.5.23)."""
    config = DoubleConfig(
        sglang_version=version,
        tool_call_parser="deepseekv4",
        capabilities=frozenset({"toolCallDropCounter"}),
    )
    draws = _draws()
    parsed = [parsers.parse(config, d.output, d.tools) for d in draws]
    assert {d.output.kind for d in draws} == set(outputs.Generated)
    # recipe empties some garbled answers (shapes.Shape.EMPTY)
    empty = {shapes.Shape.EMPTY} if config.parses_with_recipe else set()
    assert {p.shape for p in parsed} == set(parsers.answers(config).values()) | empty
    reasons = {p.drop_reason for p in parsed} - {None}
    expected = (
        {"unclosed", "malformed", "unterminated_section"}
        if version == "0.5.23"
        else {
            "unclosed",
            "unterminated_section",
            "exception",
        }
    )
    assert reasons == expected

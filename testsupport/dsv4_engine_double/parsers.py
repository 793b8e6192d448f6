"""What the release the double runs as does with a corrupted tool call: leak it or drop it.

SGLang parses a DeepSeek-V4 answer's DSML with `DeepSeekV4Detector` (inheriting
`DeepSeekV32Detector`, python/sglang/srt/function_call/deepseekv32_detector.py):

- 0.5.16 (the incident's base): on an exception `detect_and_parse` returns the whole text, DSML
  and all, as `content` with no `tool_calls`, and a bare invoke is returned as content too. The
  double keeps its leak shapes (markup in `content`, finish_reason "stop").
- 0.5.21 on (0.5.23): the detector fails closed (upstream #40236/#40237): an unclosed invoke is
  dropped with `Dropping unclosed DeepSeek invoke '<name>'`, a malformed one with `Dropping
  malformed DeepSeek invoke: <error>`, a `<｜DSML｜tool_calls>` that never closes with no log line
  of the detector's own; the client gets HTTP 200, finish_reason "stop", no `tool_calls`, only
  the prose before the DSML. Streamed, an unclosed invoke is discarded silently at the end;
  a non-streamed answer also gets serving_chat's `Tool call marker present but no complete
  call parsed from deepseekv4 output; dropping the incomplete call`. The double answers its
  DSML leak shapes as such drops: an unclosed invoke in a closed section, a malformed
  parameter, or a section cut off inside its first invoke.

What the double does NOT model: on 0.5.23, with the operator's `--tool-call-parser deepseekv4`
/ `--reasoning-parser deepseek-v4` and a loaded tokenizer, /v1/chat/completions output is parsed
by deepseek-recipe (sglang/srt/parser/deepseek_recipe_output.py), not by this detector; recipe
returns unclosed invokes and unterminated sections as calls (broken arguments at worst) and
drops only what it cannot read (docs/engine-notes.md, "Leak shapes").

With `toolCallDropCounter` (the image's patch 0002) the engine counts every response parsed while
the request offered tools in `sglang:dsv4_tool_call_responses_total` and each response with a
dropped call in `sglang:dsv4_tool_call_drops_total{reason}`, and logs `Dropping unterminated
DeepSeek tool-call section`. Pure: `random.Random` instances carry the draws.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from dsv4_engine_double.config import DoubleConfig
from dsv4_engine_double.shapes import Shape

# The 0.5.16 shapes that are DSML the parser saw and failed on (returned as content).
DSML_LEAKS = frozenset(
    {Shape.DSML_BLOCK, Shape.BARE_INVOKE, Shape.V32_BLOCK_NAME, Shape.UNTERMINATED}
)
DROPS: dict[Shape, str] = {
    Shape.DROPPED_UNCLOSED: "unclosed",
    Shape.DROPPED_MALFORMED: "malformed",
    Shape.DROPPED_UNTERMINATED: "unterminated_section",
}
# The 0.5.16 leaks that come out of detect_and_parse's exception path (a section start in the
# content); the others (a bare invoke, the V3.2 block name) are not seen as a section at all.
EXCEPTION_LEAKS = frozenset({Shape.DSML_BLOCK, Shape.UNTERMINATED})
MARKER_LINE = (
    "Tool call marker present but no complete call parsed from {parser} output; "
    "dropping the incomplete call"
)
UNTERMINATED_WARNING = "Dropping unterminated DeepSeek tool-call section"


def release_shape(config: DoubleConfig, shape: Shape, rng: random.Random) -> Shape:
    """The answer `shape` becomes in the release `config` runs as."""
    if not config.fails_closed or shape not in DSML_LEAKS:
        return shape
    if rng.random() < config.unterminated_share:
        return Shape.DROPPED_UNTERMINATED
    return Shape.DROPPED_UNCLOSED if rng.random() < 0.5 else Shape.DROPPED_MALFORMED


def offers_tools(body: Mapping[str, Any]) -> bool:
    """Whether the request's output runs through the tool-call parser."""
    return bool(body.get("tools")) and body.get("tool_choice", "auto") != "none"


def drop_reason(config: DoubleConfig, shape: Shape | None) -> str | None:
    """The reason `sglang:dsv4_tool_call_drops_total` counts this answer under, if any."""
    if shape is None:
        return None
    if config.fails_closed:
        return DROPS.get(shape)
    return "exception" if shape in EXCEPTION_LEAKS else None


def log_lines(config: DoubleConfig, shape: Shape | None, name: str, *, stream: bool) -> list[str]:
    """The engine's log lines (WARNING) for an answer of `shape` to a call of tool `name`."""
    if shape not in DROPS or not config.fails_closed:
        return []
    patched = "toolCallDropCounter" in config.capabilities
    lines = {
        # streamed, finish() discards the open invoke silently; the patch logs it
        Shape.DROPPED_UNCLOSED: (
            [f"Dropping unclosed DeepSeek invoke '{name}'"] if patched or not stream else []
        ),
        Shape.DROPPED_MALFORMED: [
            "Dropping malformed DeepSeek invoke: Malformed DeepSeek tool parameter"
        ],
        Shape.DROPPED_UNTERMINATED: [UNTERMINATED_WARNING] if patched else [],
    }[shape]
    if not stream:
        lines.append(MARKER_LINE.format(parser=config.tool_call_parser or "deepseekv4"))
    return lines

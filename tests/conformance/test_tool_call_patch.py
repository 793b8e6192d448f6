"""toolCallDropCounter (images/engine/patches/<version>/0002): each release's own tool-call parsers,
unpatched and patched by the image's patch step, on crafted DeepSeek-V4 outputs.

The patched parse must return exactly the calls and the text the unpatched one returns, and
move exactly the expected counters in the process's Prometheus registry: one response each, and
the drop reason below (none for `-`). tool_call_check.py runs the parsers inside the release's
environment; the expectations are what each release's code does (docs/engine-notes.md, "Leak
shapes").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .image_build import tool_call_parses
from .release_env import parse_tool_calls

pytestmark = pytest.mark.conformance

S, E = "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"
INVOKE, INVOKE_END = '<｜DSML｜invoke name="get_weather">', "</｜DSML｜invoke>"
PARAM = '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>'
BAD_PARAM = '<｜DSML｜parameter name="city">Paris</｜DSML｜parameter>'  # no string=
PROSE = "Let me check.\n\n"
# Each output as the chunks a stream delivers it in.
OUTPUTS: dict[str, list[str]] = {
    "clean": [PROSE, f"{S}\n{INVOKE}\n{PARAM}\n", f"{INVOKE_END}\n{E}"],
    "prose": ["The weather ", "is fine."],
    "unclosed": [PROSE, f"{S}\n{INVOKE}\n", f"{PARAM}\n{E}"],
    "malformed": [PROSE, f"{S}\n{INVOKE}\n", f"{BAD_PARAM}\n{INVOKE_END}\n{E}"],
    "unterminated": [PROSE, f"{S}\n{INVOKE}\n{PARAM}\n", f"{INVOKE_END}\n"],
    "open_section": [PROSE, f"{S}\n"],
    "nameless_invoke": [PROSE, "<｜DSML｜invoke"],
    "bare_invoke": [PROSE, f"{INVOKE}\n{PARAM}\n{INVOKE_END}"],
    "exception": [PROSE, f"{S}\n{INVOKE}\n{PARAM}\n", f"{INVOKE_END}\n{E}"],  # fault injected
}
# (output, path) -> drop reason per release; `whole` is detect_and_parse, `stream` is
# parse_streaming_increment then the stream's end, `recipe` deepseek-recipe's output parser.
EXPECTED: dict[str, dict[tuple[str, str], str]] = {
    "0.5.16": {
        # an unclosed or malformed invoke becomes a call; a bare invoke leaks as content
        ("clean", "whole"): "-",
        ("clean", "stream"): "-",
        ("prose", "whole"): "-",
        ("prose", "stream"): "-",
        ("unclosed", "whole"): "-",
        ("unclosed", "stream"): "-",
        ("malformed", "whole"): "-",
        ("malformed", "stream"): "-",
        ("unterminated", "whole"): "unterminated_section",
        ("unterminated", "stream"): "-",  # the call streams out before the section ends
        ("open_section", "whole"): "unterminated_section",
        ("open_section", "stream"): "unterminated_section",
        ("nameless_invoke", "whole"): "-",  # no section: returned as content
        ("nameless_invoke", "stream"): "unclosed",
        ("bare_invoke", "whole"): "-",
        ("bare_invoke", "stream"): "-",
        ("exception", "whole"): "exception",  # the markup comes back as content
        ("exception", "stream"): "exception",
    },
    "0.5.23": {
        ("clean", "whole"): "-",
        ("clean", "stream"): "-",
        ("clean", "recipe"): "-",
        ("prose", "whole"): "-",
        ("prose", "stream"): "-",
        ("prose", "recipe"): "-",
        ("unclosed", "whole"): "unclosed",
        ("unclosed", "stream"): "unclosed",
        ("unclosed", "recipe"): "-",  # recipe returns it as a call
        ("malformed", "whole"): "malformed",
        ("malformed", "stream"): "malformed",
        ("malformed", "recipe"): "-",  # a call whose arguments hold the bad parameter
        ("unterminated", "whole"): "unterminated_section",
        ("unterminated", "stream"): "-",  # the call streams out before the section ends
        ("unterminated", "recipe"): "-",
        ("open_section", "whole"): "unterminated_section",
        ("open_section", "stream"): "unterminated_section",
        ("open_section", "recipe"): "unterminated_section",
        ("nameless_invoke", "whole"): "unclosed",
        ("nameless_invoke", "stream"): "unclosed",
        ("nameless_invoke", "recipe"): "unclosed",
        ("bare_invoke", "whole"): "-",
        ("bare_invoke", "stream"): "-",
        ("bare_invoke", "recipe"): "-",
        ("exception", "whole"): "exception",  # fails closed: the prose only
        ("exception", "stream"): "exception",
    },
}


def _cases(version: str) -> list[dict[str, Any]]:
    return [
        {
            "id": f"{output}/{path}",
            "path": "recipe" if path == "recipe" else "detector",
            "stream": path != "whole",
            "chunks": OUTPUTS[output],
            "fault": output == "exception",
        }
        for output, path in EXPECTED[version]
    ]


def test_the_patched_parsers_count_each_drop_and_parse_the_same(
    version: str, tmp_path: Path
) -> None:
    cases = _cases(version)
    wheel, patched = tool_call_parses(version, cases, tmp_path)
    for case in cases:
        output, path = case["id"].split("/")
        before, after = wheel[case["id"]], patched[case["id"]]
        assert after["calls"] == before["calls"], case["id"]
        assert after["text"] == before["text"], case["id"]
        assert before["counted"] is None  # the wheel has no counters
        reason = EXPECTED[version][(output, path)]
        expected = {"responses": 1.0} | ({reason: 1.0} if reason != "-" else {})
        assert after["counted"] == expected, case["id"]
    # the drop upstream does not log is logged by the patch, and only by it
    warning = "Dropping unterminated DeepSeek tool-call section"
    assert warning in patched["log"] and warning not in wheel["log"]


def test_what_each_release_answers_for_the_leak_shapes(version: str, tmp_path: Path) -> None:
    """The shapes docs/engine-notes.md describes, from the unpatched wheel: 0.5.16 returns the
    markup as content on its exception path, 0.5.23 fails closed to the prose before it."""
    cases = _cases(version)
    wheel = parse_tool_calls(version, cases, None)
    leak = wheel["exception/whole"]
    assert leak["calls"] == []
    if version == "0.5.16":
        assert S in leak["text"] and INVOKE in leak["text"]
        assert wheel["unterminated/whole"] == {
            "calls": [],
            "text": "Let me check.",
            "counted": None,
        }
    else:
        assert leak["text"] == "Let me check."
        for output in ("unclosed", "malformed", "unterminated", "open_section"):
            assert wheel[f"{output}/whole"]["calls"] == [], output
            assert wheel[f"{output}/whole"]["text"] == "Let me check.", output
        # recipe, DeepSeek-V4's chat path there, returns those calls instead
        assert wheel["unclosed/recipe"]["calls"] and wheel["unterminated/recipe"]["calls"]
        malformed = "".join(str(piece[2]) for piece in wheel["malformed/recipe"]["calls"])
        assert "｜DSML｜" in malformed  # the broken parameter ends up inside the arguments

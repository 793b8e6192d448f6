"""Markup that must never reach a client: DSML, special tokens, tool-call and think tags."""

from __future__ import annotations

import re

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

# Each with a substring every match holds: `in` runs at memory speed, so text without it
# skips that regex scan.
_MARKUP_CHECKS: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("DSML markup", "DSML", _DSML_TOKEN),
    ("special token", "<", _SPECIAL_TOKEN),
    ("tool-call markup", "<", _TOOL_TAG),
)

# Every pattern above, for `bench/detector.py`'s floor: one regex joining them all, scanned once.
MARKUP_PATTERNS = (_DSML_TOKEN, _SPECIAL_TOKEN, _TOOL_TAG, _THINK_TAG)


def find_markup(
    text: str, *, content: bool = True, utf8: bytes | None = None
) -> tuple[str, int] | None:
    """The first markup kind in `text` and where it starts, or None.

    `content=True` also flags `<think>` tags, which the reasoning parser strips from content.
    `utf8`, the text's UTF-8 when the caller has it: the needles (ASCII) are looked for there,
    three times faster than in a `str` with a character above U+00FF.
    """
    found: tuple[int, str] | None = None
    checks = _MARKUP_CHECKS + ((("think tag", "<", _THINK_TAG),) if content else ())
    for name, needle, pattern in checks:
        holds = needle in text if utf8 is None else needle.encode() in utf8
        match = pattern.search(text) if holds else None
        if match and (found is None or match.start() < found[0]):
            found = (match.start(), name)
    return None if found is None else (found[1], found[0])

"""The degenerate heuristic's fast paths give exactly the verdicts of the plain definitions.

Each oracle below is the rule as first written (one regex pass over all of the text, one
Counter over all of its 4-grams, one loop over every segment); the rules now skip work on
normal text (ASCII tokenization, an early exit on the first 45% of the 4-grams, a first
alternative of the tag regex alone when no `="` occurs, a segment loop only after a run of
three). Texts are drawn to hit both sides of each shortcut: repetitive and diverse, ASCII and
not, with U+001C..U+001F, with and without attribute values.
"""

from __future__ import annotations

import re
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4_operator.probe import degenerate

TOKEN = re.compile(r"\w+|[^\w\s]+")
SEGMENT = re.compile(r"[^\n.!?。！？]+[.!?。！？]*")
LETTER = re.compile(r"[^\W\d_]")
TAG = re.compile(r"</?[A-Za-z_][\w:.-]*(?:\s[^<>]{0,80})?/?>|\b\w+\s*=\s*\"[^\"<>]*\"\s*/?>")


def low_diversity_oracle(text: str) -> bool:
    tokens = TOKEN.findall(text)
    if len(tokens) < 60:
        return False
    grams = Counter(zip(tokens, tokens[1:], tokens[2:], tokens[3:], strict=False))
    return len(grams) / (len(tokens) - 3) < 0.40


def repeated_segment_oracle(text: str) -> int | None:
    run, previous, start = 1, "", 0
    for match in SEGMENT.finditer(text):
        segment = match.group().strip()
        if len(segment) < 8 or not LETTER.search(segment):
            run, previous = 1, ""
        elif segment == previous:
            run += 1
            if run >= 3:
                return start
        else:
            run, previous, start = 1, segment, match.start()
    return None


def tag_soup_oracle(text: str) -> bool:
    fragments = list(TAG.finditer(text))
    if text.count(">") < 6 or len(fragments) < 6:
        return False
    covered = sum(len(re.sub(r"\s", "", m.group())) for m in fragments)
    total = len(re.sub(r"\s", "", text))
    return total > 0 and covered / total >= 0.60


WORDS = ["the", "cat", "é", "日本", "x1", "_", 'a="b">', "<p>", "</b>", "...", ",", "\x1c", "\x1f"]
SEPARATORS = [" ", "  ", "\n", ". ", "! ", "\t", "\x1d", "。"]


@st.composite
def texts(draw: st.DrawFn) -> str:
    vocabulary = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=len(WORDS)))
    unit = draw(st.lists(st.sampled_from(vocabulary), min_size=1, max_size=12))
    repeats = draw(st.integers(min_value=1, max_value=40))
    noise = draw(st.lists(st.sampled_from(WORDS), max_size=200))
    words = unit * repeats + noise if draw(st.booleans()) else noise + unit * repeats
    separators = draw(st.lists(st.sampled_from(SEPARATORS), min_size=1, max_size=3))
    return "".join(w + separators[i % len(separators)] for i, w in enumerate(words))


@settings(max_examples=600, deadline=None, derandomize=True)
@given(text=texts())
def test_fast_paths_agree_with_the_plain_rules(text: str) -> None:
    assert degenerate._tokens(text) == TOKEN.findall(text)
    assert (degenerate._low_diversity(text) is not None) is low_diversity_oracle(text)
    found = degenerate._repeated_segment(text)
    assert (found[0] if found else None) == repeated_segment_oracle(text)
    if not degenerate._ATTRIBUTE_VALUE.search(text):
        assert degenerate._TAG_ONLY.findall(text) == TAG.findall(text)
    assert (degenerate._tag_soup(text) is not None) is tag_soup_oracle(text)


def test_the_shortcuts_are_taken_both_ways() -> None:
    """The drawn texts above reach both branches: low and high diversity, runs and none."""
    diverse = " ".join(f"w{i}" for i in range(200))
    looping = "the cat sat. " * 30
    assert not low_diversity_oracle(diverse) and degenerate._low_diversity(diverse) is None
    assert low_diversity_oracle(looping) and degenerate._low_diversity(looping) is not None
    found = degenerate._repeated_segment(looping)
    assert repeated_segment_oracle(looping) == 0 and found is not None and found[0] == 0
    assert degenerate._tokens("a\x1cb") == ["a", "b"]  # whitespace to str, not to ASCII \s

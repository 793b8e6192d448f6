"""The detector's fast paths give exactly the verdicts of the plain definitions.

Each oracle below is a rule as first written (one regex pass over all of the text, one Counter
over all of its 4-grams, one loop over every segment and every period, the combined tag regex
without possessive quantifiers, every markup regex on every text); the rules now skip work on
normal text (byte-level splits and counts, an early exit on the first 45% of the 4-grams,
`rfind` for the candidate periods, the tag regex's two alternatives apart, a substring test
before each markup regex). Texts are drawn to reach both sides of each shortcut: repetitive
and diverse, ASCII and not, with U+001C..U+001F, with and without tags and attribute values,
garbage characters and their UTF-8 lead bytes, markup and near-markup.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4_operator.leak import degenerate
from dsv4_operator.leak.markup import find_markup

SEGMENT = re.compile(r"[^\n.!?。！？]+[.!?。！？]*")
LETTER = re.compile(r"[^\W\d_]")
TAG = re.compile(r"</?[A-Za-z_][\w:.-]*(?:\s[^<>]{0,80})?/?>|\b\w+\s*=\s*\"[^\"<>]*\"\s*/?>")
GARBAGE = re.compile(
    "[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]"
)
MARKUP = (
    (
        "DSML markup",
        re.compile(
            r"｜DSML[｜|]|\|DSML｜|</?\|DSML\||\|DSML\|(?:invoke|parameter|tool_calls|function_calls)"
        ),
    ),
    ("special token", re.compile(r"<[｜|][^<>｜|\n]{1,48}[｜|]>")),
    (
        "tool-call markup",
        re.compile(
            r"<\s*invoke\b|</\s*invoke\s*>|<\s*parameter\s+name\s*=|</\s*parameter\s*>"
            r"|</?\s*(?:function_calls|function_call|tool_calls|tool_call)\s*>",
            re.IGNORECASE,
        ),
    ),
    ("think tag", re.compile(r"</?think>")),
)


def tail_loop_oracle(text: str) -> int | None:
    n = len(text)
    for period in range(2, min(100, n // 3) + 1):
        span = max(3 * period, 48)
        if span > n:
            break
        tail = text[n - span :]
        if tail[period:] == tail[:-period] and LETTER.search(text[n - period :]):
            start = n - span
            while start > 0 and text[start - 1] == text[start - 1 + period]:
                start -= 1
            return start
    return None


def low_diversity_oracle(text: str) -> bool:
    words = text.split()
    if len(words) < 60:
        return False
    grams = Counter(zip(words, words[1:], words[2:], words[3:], strict=False))
    return len(grams) / (len(words) - 3) < 0.40


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


def garbage_oracle(text: str) -> int | None:
    found = [m.start() for m in GARBAGE.finditer(text)]
    return found[0] if len(found) >= 3 else None


def markup_oracle(text: str, content: bool) -> tuple[str, int] | None:
    found = [
        (match.start(), name)
        for name, pattern in MARKUP[: 4 if content else 3]
        if (match := pattern.search(text))
    ]
    return None if not found else min(found, key=lambda f: f[0])[::-1]


WORDS = [
    *("the", "cat", "é", "日本", "x1", "_", "...", ",", "!", "?", "。"),
    *('a="b">', 'k = "v" />', '="', "=", '"', "<p>", "</b>", '<a href="u">', ">", "<"),
    *("\x1c", "\x1f", "\ufffd", "\x07", "\x85", "\ue000", "\xa0", "£", "\U000f0001"),
    "\U00100001",
    *("\u2019", "\u2014", "\u2003", "\ud800"),  # typographic, wide space, a lone surrogate
    *("DSML", "|DSML|invoke", "｜DSML｜", "<|im_end|>", "<｜end▁of▁sentence｜>", "<think>"),
    *("< invoke", "</tool_call>"),
]
SEPARATORS = [" ", "  ", "\n", ". ", "! ", "\t", "\x1d", "。", ""]


@st.composite
def texts(draw: st.DrawFn) -> str:
    vocabulary = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=len(WORDS)))
    unit = draw(st.lists(st.sampled_from(vocabulary), min_size=1, max_size=12))
    repeats = draw(st.integers(min_value=1, max_value=40))
    noise = draw(st.lists(st.sampled_from(WORDS), max_size=200))
    words = unit * repeats + noise if draw(st.booleans()) else noise + unit * repeats
    separators = draw(st.lists(st.sampled_from(SEPARATORS), min_size=1, max_size=3))
    return "".join(w + separators[i % len(separators)] for i, w in enumerate(words))


@settings(max_examples=800, deadline=None, derandomize=True)
@given(text=texts())
def test_fast_paths_agree_with_the_plain_rules(text: str) -> None:
    found = degenerate._tail_loop(text)
    assert (found[0] if found else None) == tail_loop_oracle(text)
    found = degenerate._repeated_segment(text)
    assert (found[0] if found else None) == repeated_segment_oracle(text)
    assert (degenerate._low_diversity(text) is not None) is low_diversity_oracle(text)
    assert degenerate._tag_fragments(text) == [m.span() for m in TAG.finditer(text)]
    assert (degenerate._tag_soup(text) is not None) is tag_soup_oracle(text)
    found = degenerate._garbage(text)
    assert (found[0] if found else None) == garbage_oracle(text)
    data = degenerate.utf8(text)
    assert degenerate.degenerate_reason(text, data) == degenerate.degenerate_reason(text)
    for content in (True, False):
        assert find_markup(text, content=content) == markup_oracle(text, content)
        assert find_markup(text, content=content, utf8=data) == markup_oracle(text, content)


def test_the_shortcuts_are_taken_both_ways() -> None:
    """Texts on either side of each shortcut, by hand (the drawn ones above reach both too)."""
    diverse = " ".join(f"w{i}" for i in range(200))
    looping = "the cat sat. " * 30
    assert not low_diversity_oracle(diverse) and degenerate._low_diversity(diverse) is None
    assert low_diversity_oracle(looping) and degenerate._low_diversity(looping) is not None
    found = degenerate._repeated_segment(looping)
    assert repeated_segment_oracle(looping) == 0 and found is not None and found[0] == 0
    # Equal sentences after unequal spacing (equal only once stripped), then the longest
    # period the tail loop looks for.
    spaced = "Intro. the same line.  the same line.\tthe same line. End"
    assert repeated_segment_oracle(spaced) == 6 and degenerate._repeated_segment(spaced)
    unit = "a" + "b" * 98 + "c"
    assert tail_loop_oracle("intro " + unit * 3) == 6
    found = degenerate._tail_loop("intro " + unit * 3)
    assert found is not None and found[0] == 6
    # Whitespace to `str.strip` but not to `bytes.strip` (U+001C, NBSP, U+3000) at the edges.
    for separated in (
        "the same line\x1c.\n" * 3,
        "Hi.\xa0same line here. same line here.\u3000same line here.",
    ):
        assert repeated_segment_oracle(separated) is not None
        assert degenerate._repeated_segment(separated) is not None
    # An attribute right after a tag: the regex takes the tag, then the attribute's word.
    soup = '<p>k="v"><b>x="y">' * 4
    assert degenerate._tag_fragments(soup) == [m.span() for m in TAG.finditer(soup)]
    assert degenerate._tag_soup(soup) is not None
    # "£" and NBSP share the lead byte C2 with C1 controls: the regex decides, and refuses.
    assert degenerate._garbage("£\xa0£\xa0 price list") is None
    assert degenerate._garbage("a\x85b\x85c\x85 text") is not None


WHITESPACE = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    text=st.text(
        alphabet=st.sampled_from([*WHITESPACE, "a", "é", "’", "—", "中", "\U0001f600", "\x1f"]),
        max_size=40,
    )
)
def test_the_byte_counts_bound_words_and_whitespace(text: str) -> None:
    """Every Unicode whitespace character, next to one- to four-byte others: the bounds hold."""
    data = text.encode("utf-8", "surrogatepass")
    assert degenerate._word_bound(data) >= len(text.split())
    assert degenerate._whitespace_bound(data) >= sum(c.isspace() for c in text)


def test_the_whitespace_lead_bytes_are_those_of_unicode() -> None:
    leads = {c.encode()[0] for c in WHITESPACE if not c.isascii()}
    assert bytes(sorted(leads)) == degenerate._WIDE_WHITESPACE_LEADS
    ascii_whitespace = {ord(c) for c in WHITESPACE if c.isascii()}
    assert ascii_whitespace == set(degenerate._ASCII_WHITESPACE)


def test_the_new_shortcuts_are_taken_both_ways() -> None:
    """Prose is proved diverse on a prefix; near the threshold the whole text decides."""
    prose = " ".join(f"word{i} and more" for i in range(300))
    assert degenerate._diverse_prefix(prose, len(prose.split()) - 3)
    twice = prose + " " + prose  # 50% distinct: not low, but no prefix can prove it alone
    assert degenerate._diverse_prefix(twice, len(twice.split()) - 3)
    thrice = " ".join([prose] * 3)  # 33%: low diversity, and the shortcut must not say otherwise
    assert not degenerate._diverse_prefix(thrice, len(thrice.split()) - 3)
    assert low_diversity_oracle(thrice) and degenerate._low_diversity(thrice) is not None
    # Three equal digits-only pieces are no segment: the letter check spares the regex loop.
    numbers = "Values: 2.5, 2.5, 2.5, 2.5, 2.5 and then some prose."
    data = numbers.encode()
    assert not degenerate._may_repeat_segments(numbers, data)
    assert repeated_segment_oracle(numbers) is None
    # Tags that cover little of a long text: refused on the fragments' lengths alone.
    tagged = "<p>a</p> " * 3 + "plain prose, " * 40
    assert not tag_soup_oracle(tagged) and degenerate._tag_soup(tagged) is None

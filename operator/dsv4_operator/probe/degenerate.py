"""Degenerate text: repetition loops, repeated segments, low diversity, tag soup, garbage.

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

import re
from collections import Counter

_MIN_TEXT = 24
_LOOP_MIN_CHARS, _LOOP_MIN_PERIODS, _LOOP_MAX_PERIOD = 48, 3, 100
_SEGMENT_MIN_CHARS, _SEGMENT_REPEATS = 8, 3
_NGRAM, _NGRAM_MIN_TOKENS, _NGRAM_MIN_DISTINCT = 4, 60, 0.40
_TAG_MIN, _TAG_MIN_SHARE = 6, 0.60
_GARBAGE_MIN = 3

_LETTER = re.compile(r"[^\W\d_]")
_TOKEN = re.compile(r"\w+|[^\w\s]+")
# The same tokens for ASCII text without U+001C..U+001F (whitespace to `str`, not to the ASCII
# `\s`), scanned about 1.6x faster.
_ASCII_TOKEN = re.compile(r"\w+|[^\w\s]+", re.ASCII)
_UNICODE_ONLY_WHITESPACE = re.compile("[\x1c-\x1f]")
_SEGMENT = re.compile(r"[^\n.!?。！？]+[.!?。！？]*")
# U+FFFD, and the Unicode categories Cc (control, but tab/newline/CR) and Co (private use),
# spelled as ranges: one regex scan instead of a category lookup per character.
_GARBAGE = re.compile(
    "[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
    "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]"
)
# `\b`: an attribute starts at a word start (any match from inside a word is also one from
# its start, so finditer finds the same fragments without trying every position in a word).
_TAG_FRAGMENT = re.compile(
    r"</?[A-Za-z_][\w:.-]*(?:\s[^<>]{0,80})?/?>|\b\w+\s*=\s*\"[^\"<>]*\"\s*/?>"
)
# Its first alternative alone: the same matches when no `="` occurs (the second alternative
# needs one), and two orders of magnitude faster on prose, where the second is tried at
# every word.
_TAG_ONLY = re.compile(r"</?[A-Za-z_][\w:.-]*(?:\s[^<>]{0,80})?/?>")
_ATTRIBUTE_VALUE = re.compile(r"=\s*\"")


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
    # Fast exit: no three equal consecutive segments at all (the usual case); the loop below
    # runs only to tell whether a run is long and lettered enough, and where it starts.
    segments = list(map(str.strip, _SEGMENT.findall(text)))
    if not any(map(_equal3, segments, segments[1:], segments[2:])):
        return None
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


def _equal3(a: str, b: str, c: str) -> bool:
    return a == b == c


def _tokens(text: str) -> list[str]:
    ascii_tokens = text.isascii() and not _UNICODE_ONLY_WHITESPACE.search(text)
    return (_ASCII_TOKEN if ascii_tokens else _TOKEN).findall(text)


def _low_diversity(text: str) -> tuple[int, str] | None:
    tokens = _tokens(text)
    if len(tokens) < _NGRAM_MIN_TOKENS:
        return None
    grams = len(tokens) - _NGRAM + 1
    # Distinct 4-grams only grow with more of the text: when the first 45% of them already
    # reach the threshold, the whole does too (normal text stops here, at half the work).
    head = int(grams * 0.45) + 1
    seen = set(zip(*(tokens[i : head + i] for i in range(_NGRAM)), strict=False))
    if len(seen) / grams >= _NGRAM_MIN_DISTINCT:
        return None
    # zip of shifted views: the 4-grams without a slice per position.
    counts = Counter(zip(*(tokens[i:] for i in range(_NGRAM)), strict=False))
    distinct = len(counts) / grams
    if distinct >= _NGRAM_MIN_DISTINCT:
        return None
    top = " ".join(counts.most_common(1)[0][0])
    return max(0, text.find(top)), f"low diversity: {distinct:.0%} distinct {_NGRAM}-grams"


def _tag_soup(text: str) -> tuple[int, str] | None:
    if text.count(">") < _TAG_MIN:  # every fragment ends in '>': most text stops here
        return None
    pattern = _TAG_FRAGMENT if _ATTRIBUTE_VALUE.search(text) else _TAG_ONLY
    fragments = list(pattern.finditer(text))
    if len(fragments) < _TAG_MIN:
        return None
    covered = sum(len(re.sub(r"\s", "", m.group())) for m in fragments)
    total = len(re.sub(r"\s", "", text))
    if total == 0 or covered / total < _TAG_MIN_SHARE:
        return None
    return fragments[0].start(), f"tag soup: {len(fragments)} tag fragments"


def _garbage(text: str) -> tuple[int, str] | None:
    positions = [m.start() for m in _GARBAGE.finditer(text)]
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

"""Degenerate text: repetition loops, repeated segments, low diversity, tag soup, garbage.

Degenerate heuristic (each rule looks at one text; a text shorter than 24 characters is skipped):

- tail loop: the text ends in a periodic run, period 2..100 characters, at least 3 periods and
  48 characters long, whose unit holds a letter (a model stuck in a loop runs to max_tokens);
- repeated segment: the same line or sentence (>= 8 characters, with a letter) three or more
  times in a row anywhere;
- low diversity: at least 60 words (whitespace-separated, punctuation included) and fewer than
  40% distinct 4-grams of words;
- tag soup: at least 6 tag-like fragments (`<x ...>`, `</x>`, `attr="v">`) covering at least
  60% of the non-space characters;
- garbage: three or more U+FFFD replacement, control (other than tab/newline/CR) or
  private-use characters.

Its false-positive rate on normal prose is measured by `bench/detector.py` and pinned by
`tests/unit/test_dsml.py`. Token salad without any repetition, markup or garbage characters is
not detected (no language model here); such a turn still fails as `missing_call`.

Each rule first runs a C-speed check (`str` and `bytes` methods) that proves, on most normal
text, that it cannot fire; `tests/unit/test_degenerate_fast_paths.py` holds each to the plain
definition and `tests/unit/test_degenerate_pinned.py` keeps the verdicts of a pinned corpus.
The text's UTF-8 is made once (`utf8`, by `classify_response` or `degenerate_reason`) and
shared by the byte-level checks and the markup needles. The costly ones, on 2-20 KB of prose
(`bench/detector.py`):

- low diversity: the number of words is bounded from above by counting word starts in the
  bytes (one `translate` and a popcount), so the distinct 4-grams of a prefix of the words
  (split with `maxsplit`) prove the ratio without splitting the rest: about 43% of the words;
- repeated segment: the equal neighbours the byte-level split finds must also hold a letter
  (an ASCII letter or a non-ASCII byte) before the segment regex runs over the text;
- tag soup: the fragments' own lengths, against the non-space characters bounded from below by
  a whitespace count, before any split.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import repeat
from operator import and_

_MIN_TEXT = 24
_LOOP_MIN_CHARS, _LOOP_MIN_PERIODS, _LOOP_MAX_PERIOD = 48, 3, 100
_SEGMENT_MIN_CHARS, _SEGMENT_REPEATS = 8, 3
_NGRAM, _NGRAM_MIN_WORDS, _NGRAM_MIN_DISTINCT = 4, 60, 0.40
_TAG_MIN, _TAG_MIN_SHARE = 6, 0.60
_GARBAGE_MIN = 3

_LETTER = re.compile(r"[^\W\d_]")
_SEGMENT = re.compile(r"[^\n.!?。！？]+[.!?。！？]*")
_WIDE_SEGMENT_ENDS = "。！？"
# For `_may_repeat_segments`: the ASCII segment ends to "\n", every other byte kept; and the
# bytes stripped from a piece: ASCII whitespace as `str` has it, and every non-ASCII byte (a
# superset of the UTF-8 of Unicode whitespace).
_ASCII_SEGMENT_ENDS = bytes(ord("\n") if chr(b) in "\n.!?" else b for b in range(256))
_PIECE_EDGES = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f" + bytes(range(0x80, 0x100))
# A segment needs a letter: an ASCII one, or a non-ASCII character (some byte >= 0x80).
_MAY_HOLD_LETTER = re.compile(rb"[A-Za-z\x80-\xff]")
# The bytes of whitespace as `str.split` has it, mapped to 0 (every other byte to 1): the ASCII
# ones, and the lead bytes of the others' UTF-8 (U+0085 and U+00A0: C2, U+1680: E1,
# U+2000..U+205F: E2, U+3000: E3), so that counting zeros bounds the whitespace from above.
_ASCII_WHITESPACE = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"
_WIDE_WHITESPACE_LEADS = b"\xc2\xe1\xe2\xe3"
_WHITESPACE_TO_ZERO = bytes(
    0 if b in _ASCII_WHITESPACE + _WIDE_WHITESPACE_LEADS else 1 for b in range(256)
)
# For `_word_bound`: ASCII whitespace and UTF-8 continuation bytes to 0, the first byte of
# every other character to 1. Every word then starts where a 0 turns into a 1 (the whitespace
# before it ends in ASCII whitespace or a continuation byte); other characters only add more.
_WORD_STARTS = bytes(0 if b in _ASCII_WHITESPACE or 0x80 <= b < 0xC0 else 1 for b in range(256))
# U+FFFD, and the Unicode categories Cc (control, but tab/newline/CR) and Co (private use),
# spelled as ranges: one regex scan instead of a category lookup per character.
_GARBAGE = re.compile(
    "[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
    "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]"
)
# The UTF-8 bytes a garbage character can start with: ASCII garbage itself, and the lead
# bytes of U+0080..U+009F (C2), U+E000..U+F8FF and U+FFFD (EE, EF), planes 15-16 (F3, F4).
_NOT_GARBAGE_LEAD = bytes(
    b
    for b in range(256)
    if not (_GARBAGE.match(chr(b)) if b < 0x80 else b in (0xC2, 0xEE, 0xEF, 0xF3, 0xF4))
)
# Tag-like fragments are what `_TAG_OPEN|_TAG_ATTRIBUTE` finds: `<x ...>`/`</x>`, or
# `attr="v">` from the start of the attribute's word. `_tag_fragments` runs them apart, each
# from a literal ('<', `="`), where the combined regex tries the second at every word (20
# MB/s). Possessive where giving back cannot help (the next item never matches it).
_TAG_OPEN = re.compile(r"</?[A-Za-z_][\w:.-]*+(?:\s[^<>]{0,80})?/?>")
_TAG_ATTRIBUTE = re.compile(r"\b\w++\s*+=\s*+\"[^\"<>]*+\"\s*+/?>")
_ATTRIBUTE_VALUE = re.compile(r"=\s*+\"")


def _tail_loop(text: str, data: bytes | None = None) -> tuple[int, str] | None:
    n = len(text)
    if n < _LOOP_MIN_CHARS:
        return None
    # A tail periodic with period p repeats the last character p back: only those periods
    # (found by `rfind`, smallest first) are compared.
    lowest = n - 1 - min(_LOOP_MAX_PERIOD, n // _LOOP_MIN_PERIODS)
    at = text.rfind(text[-1], lowest, n - 2)
    while at >= 0:
        period = n - 1 - at
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
        at = text.rfind(text[-1], lowest, at)
    return None


def _whitespace_bound(data: bytes) -> int:
    """At least the number of whitespace characters (`str.isspace`) in the text `data` encodes."""
    return data.translate(_WHITESPACE_TO_ZERO).count(0)


def _word_bound(data: bytes) -> int:
    """At least the number of words (`str.split`) in the text `data` encodes: the runs of 1s in
    `_WORD_STARTS`, counted on the bits of one integer at C speed (`bytes.count` of a two-byte
    pattern in zeros and ones is not). XOR with the integer shifted by a byte has a bit where
    a byte differs from the one before it: two per run of 1s, less one if the text ends in it.
    """
    starts = int.from_bytes(data.translate(_WORD_STARTS), "big")
    return ((starts ^ (starts >> 8)).bit_count() + 1) // 2


def _repeated_segment(text: str, data: bytes | None = None) -> tuple[int, str] | None:
    if not _may_repeat_segments(text, utf8(text) if data is None else data):
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


def _may_repeat_segments(text: str, data: bytes) -> bool:
    """False when no three consecutive segments are equal (stripped) and hold a letter.

    A segment is a run of characters other than the segment ends, then its ends. Two equal
    stripped segments have equal stripped runs, and the runs are the non-empty pieces of the
    text split at every segment end, one per segment. Without a wide end (。！？) the split runs
    on the UTF-8 bytes `data`, at C speed; stripping more than `str.strip` (every non-ASCII byte
    at either edge) keeps equal pieces equal. Equal neighbours are rare: only for them is the
    piece checked for a letter (three equal digits-and-commas pieces, as in "2.5, 2.5, 2.5",
    are no repeated segment).
    """
    if any(map(text.__contains__, _WIDE_SEGMENT_ENDS)):
        segments = list(map(str.strip, _SEGMENT.findall(text)))
        equal_next = list(map(str.__eq__, segments, segments[1:]))
        return any(map(and_, equal_next, equal_next[1:]))
    pieces = list(filter(None, data.translate(_ASCII_SEGMENT_ENDS).split(b"\n")))
    runs = list(map(bytes.strip, pieces, repeat(_PIECE_EDGES)))
    if not any(map(bytes.__eq__, runs, runs[2:])):  # a triple's first and last: one pass
        return False
    equal_next = list(map(bytes.__eq__, runs, runs[1:]))
    triples = map(and_, equal_next, equal_next[1:])
    return any(_MAY_HOLD_LETTER.search(pieces[i]) for i, found in enumerate(triples) if found)


def _low_diversity(text: str, data: bytes | None = None) -> tuple[int, str] | None:
    most_words = _word_bound(utf8(text) if data is None else data)
    if most_words < _NGRAM_MIN_WORDS or _diverse_prefix(text, most_words - _NGRAM + 1):
        return None
    words = text.split()
    if len(words) < _NGRAM_MIN_WORDS:
        return None
    grams = len(words) - _NGRAM + 1
    counts = Counter(zip(words, words[1:], words[2:], words[3:], strict=False))
    distinct = len(counts) / grams
    if distinct >= _NGRAM_MIN_DISTINCT:
        return None
    top = " ".join(counts.most_common(1)[0][0])
    return max(0, text.find(top)), f"low diversity: {distinct:.0%} distinct {_NGRAM}-grams of words"


def _diverse_prefix(text: str, most_grams: int) -> bool:
    """True when the distinct 4-grams of some prefix of `text` reach 40% of `most_grams`.

    The text has at most `most_grams` 4-grams, and its distinct ones only grow with more of
    it: then the whole text's reach 40% of its own. Words are split a chunk at a time
    (`maxsplit`, the rest left unsplit): normal text stops after the first or second, about
    43% of its words.
    """
    seen: set[tuple[str, ...]] = set()
    carry: list[str] = []  # the last words of the previous chunk: 4-grams across the cut
    rest: str | None = text
    step = most_grams * 21 // 50 + 8  # 42%: 2 in 5 are needed, normal text repeats a few
    while rest is not None:
        chunk = rest.split(None, step)
        rest = chunk.pop() if len(chunk) > step else None  # the unsplit rest of the text
        words = carry + chunk if carry else chunk
        seen.update(zip(words, words[1:], words[2:], words[3:], strict=False))
        if 5 * len(seen) >= 2 * most_grams:
            return True
        carry, step = words[1 - _NGRAM :], most_grams // 25 + 8
    return False


def _tag_soup(text: str, data: bytes | None = None) -> tuple[int, str] | None:
    # Every fragment ends in '>': most text stops here. Counted in the UTF-8 (one byte per
    # '>'), which takes a third of the time of `str.count` on text with a wide character.
    data = utf8(text) if data is None else data
    if data.count(b">") < _TAG_MIN:
        return None
    fragments = _tag_fragments(text)
    if len(fragments) < _TAG_MIN:
        return None
    # The fragments' lengths bound what they cover; the whitespace count bounds the non-space
    # characters from below. Prose with a few tags or doctest prompts stops here.
    most_covered = sum(end - start for start, end in fragments)
    least_total = len(text) - _whitespace_bound(data)
    if 5 * most_covered < 3 * least_total:
        return None
    covered = sum(len("".join(text[start:end].split())) for start, end in fragments)
    total = len("".join(text.split()))  # `str.split` and the regex `\s`: the same whitespace
    if total == 0 or covered / total < _TAG_MIN_SHARE:
        return None
    return fragments[0][0], f"tag soup: {len(fragments)} tag fragments"


def _tag_fragments(text: str) -> list[tuple[int, int]]:
    """The spans finditer finds with the two patterns joined by `|`, found apart.

    The alternatives never match at one position (one starts with '<', the other with a
    word character) and each finds every position it matches at (no match of the first holds
    a second '<'; the second matches only at a word's start, found back from its `="`), so
    taking the leftmost that starts after the last one taken is what finditer does.
    """
    candidates = [m.span() for m in _TAG_OPEN.finditer(text)] if "<" in text else []
    for value in _ATTRIBUTE_VALUE.finditer(text):
        word_end = value.start()
        while word_end > 0 and text[word_end - 1].isspace():
            word_end -= 1
        start = word_end
        while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
            start -= 1
        match = _TAG_ATTRIBUTE.match(text, start) if start < word_end else None
        if match is not None:
            candidates.append(match.span())
    fragments: list[tuple[int, int]] = []
    for start, end in sorted(candidates):
        if not fragments or start >= fragments[-1][1]:
            fragments.append((start, end))
    return fragments


def _garbage(text: str, data: bytes | None = None) -> tuple[int, str] | None:
    # Every garbage character holds one byte of _NOT_GARBAGE_LEAD's complement: fewer than
    # three such bytes and the regex cannot find three.
    data = utf8(text) if data is None else data
    if len(data.translate(None, _NOT_GARBAGE_LEAD)) < _GARBAGE_MIN:
        return None
    positions = [m.start() for m in _GARBAGE.finditer(text)]
    if len(positions) < _GARBAGE_MIN:
        return None
    return positions[0], f"{len(positions)} replacement/control characters"


_DEGENERATE_RULES = (_tail_loop, _repeated_segment, _low_diversity, _tag_soup, _garbage)


def utf8(text: str) -> bytes:
    """The UTF-8 of `text` that `degenerate_reason` and `find_markup` may share (made once)."""
    return text.encode("utf-8", "surrogatepass")


def degenerate_reason(text: str, data: bytes | None = None) -> tuple[str, int] | None:
    """Why `text` looks degenerate (and where), or None for text that looks normal.

    `data` is the text's `utf8` when the caller has made it already.
    """
    if len(text) < _MIN_TEXT:
        return None
    data = utf8(text) if data is None else data
    for rule in _DEGENERATE_RULES:
        found = rule(text, data)
        if found is not None:
            return found[1], found[0]
    return None

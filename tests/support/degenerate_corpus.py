"""The pinned corpus of the degenerate-text heuristic: texts whose verdicts must never change.

`pinned_texts()` is deterministic (seeded, no standard-library docstrings, which change with
the Python version): the corpus's written paragraphs and the Zen of Python, every text field
and string argument of the engine double's responses (every leak shape), long 2-20 KB
messages as the tap sees them (plain and typographic), and texts built to sit on either side
of each rule's threshold (a block repeated once to four times, sentences repeated with
different spacing, tag soup around 60%, two or three garbage characters, loops of 2 to 110
characters around 48 characters and three periods), plus random texts over a small
vocabulary that mixes words, segment ends, tags, garbage and wide characters.

`tests/unit/golden/degenerate-verdicts.json` holds `degenerate_reason` of each text as the
first implementation gave it (reason and position, with the text's SHA-256 to tell a changed
corpus from a changed verdict); regenerate it only when a verdict is meant to change:

    python -m tests.support.degenerate_corpus > tests/unit/golden/degenerate-verdicts.json
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections.abc import Iterator
from typing import Any

from dsv4_engine_double.corpus import PARAGRAPHS, _zen, mixed_responses
from dsv4_operator.canary.scenario import CANARY_TOOLS
from tests.support.paths import REPO

GOLDEN = REPO / "tests" / "unit" / "golden" / "degenerate-verdicts.json"

_WORDS = [
    *("the", "cat", "sat", "é", "日本", "x1", "_", "...", ",", "!", "?", "。", "！"),
    *('a="b">', 'k = "v" />', '="', "=", '"', "<p>", "</b>", '<a href="u">', ">", "<"),
    *("\x1c", "\x1f", "\ufffd", "\x07", "\x85", "\ue000", "\xa0", "£", "\u3000", "\u2019"),
]
_SEPARATORS = [" ", "  ", "\n", ". ", "! ", "\t", "\x1d", "。", "", "\n\n", " \u3000"]


def _response_texts() -> Iterator[str]:
    for sample in mixed_responses(600, seed=11, tools=CANARY_TOOLS):
        message = sample.response.get("choices", [{}])[0].get("message") or {}
        for field in ("content", "reasoning_content"):
            if isinstance(message.get(field), str):
                yield message[field]
        for call in message.get("tool_calls") or []:
            arguments = (call.get("function") or {}).get("arguments")
            if isinstance(arguments, str):
                yield arguments
                yield from _string_values(arguments)


def _string_values(arguments: str) -> list[str]:
    """The string values of every object in `arguments` (none when it is not JSON)."""
    found: list[str] = []

    def keep(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found.extend(value for _, value in pairs if isinstance(value, str))
        return dict(pairs)

    with contextlib.suppress(json.JSONDecodeError):
        json.loads(arguments, object_pairs_hook=keep)
    return found


def _long_messages(rng: random.Random) -> Iterator[str]:
    for _ in range(40):
        size = rng.randint(2000, 20000)
        parts: list[str] = []
        while sum(map(len, parts)) < size:
            parts.append(rng.choice(PARAGRAPHS))
        text = "\n\n".join(parts)[:size]
        yield text
        yield text.replace("'", "\u2019").replace(" - ", " \u2014 ")


def _thresholds(rng: random.Random) -> Iterator[str]:
    for repeats in (1, 2, 3, 4):  # 4-gram diversity: about 100%, 50%, 33%, 25%
        for _ in range(12):
            block = " ".join(rng.sample(PARAGRAPHS, rng.randint(1, 3)))
            joins = [rng.choice([" ", "\n", "\n\n", "  "]) for _ in range(repeats)]
            tail = " ".join(rng.sample(PARAGRAPHS, rng.randint(0, 2)))
            yield "".join(block + j for j in joins) + tail
    sentence_ends = [". ", ".\n", "! ", "? ", "。", "...\n", ".  ", ".\t"]
    for times in (2, 3, 4):
        for _ in range(15):
            sentence = rng.choice(PARAGRAPHS).split(". ")[0][: rng.randint(4, 40)]
            ends = [rng.choice(sentence_ends) for _ in range(times)]
            yield rng.choice(PARAGRAPHS) + " " + "".join(sentence + e for e in ends) + "The end."
    for _ in range(40):  # tag soup, its share of the non-space characters around 60%
        tags = [rng.choice(['<p class="x">', "</b>", 'k="v">', "<br/>", "<a b>"]) for _ in range(8)]
        prose = " ".join(rng.choice(PARAGRAPHS).split()[: rng.randint(0, 30)])
        yield " ".join(tags) + " " + prose
    for count in (2, 3, 4):
        for _ in range(8):
            words = rng.choice(PARAGRAPHS).split()
            for _ in range(count):
                words.insert(rng.randrange(len(words)), rng.choice(["\ufffd", "\x07", "\ue001"]))
            yield " ".join(words)
    for period in (2, 3, 5, 16, 17, 24, 33, 49, 99, 100, 101, 110):
        for periods in (2, 3, 4):
            unit = "".join(rng.choice("ab c.d\n") for _ in range(period - 1)) + "x"
            yield rng.choice(PARAGRAPHS) + unit * periods + unit[: rng.randint(0, period - 1)]


def _random_texts(rng: random.Random) -> Iterator[str]:
    for _ in range(1500):
        vocabulary = rng.sample(_WORDS, rng.randint(1, len(_WORDS)))
        unit = [rng.choice(vocabulary) for _ in range(rng.randint(1, 12))]
        noise = [rng.choice(_WORDS) for _ in range(rng.randint(0, 200))]
        words = unit * rng.randint(1, 40)
        words = words + noise if rng.random() < 0.5 else noise + words
        separators = rng.sample(_SEPARATORS, rng.randint(1, 3))
        yield "".join(w + separators[i % len(separators)] for i, w in enumerate(words))


def pinned_texts() -> list[str]:
    rng = random.Random(32)
    texts = [
        *PARAGRAPHS,
        _zen(),
        *_response_texts(),
        *_long_messages(rng),
        *_thresholds(rng),
        *_random_texts(rng),
    ]
    return list(dict.fromkeys(texts))  # each text once, in first-seen order


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


if __name__ == "__main__":
    from dsv4_operator.leak.degenerate import degenerate_reason

    rows = []
    for text in pinned_texts():
        found = degenerate_reason(text)
        rows.append([digest(text), *(found if found else (None, None))])
    print("[\n" + ",\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n]")

"""The degenerate heuristic gives the pinned corpus the verdicts its first implementation gave.

`tests/support/degenerate_corpus.py` builds the corpus (deterministic: prose, every engine
double leak shape, long messages, texts on either side of each threshold, random texts) and
says how the golden table was made. The reason and the position must both stay the same: the
reason goes into the verdict's detail and the position picks the snippet a user reads.
"""

from __future__ import annotations

import json

from dsv4_operator.leak.degenerate import degenerate_reason
from tests.support.degenerate_corpus import GOLDEN, digest, pinned_texts


def test_the_pinned_corpus_keeps_its_verdicts() -> None:
    golden = json.loads(GOLDEN.read_text("utf-8"))
    texts = pinned_texts()
    # The corpus itself is unchanged (else regenerate the table on purpose, see the module).
    assert [digest(t) for t in texts] == [row[0] for row in golden]
    changed = []
    for text, (_, reason, position) in zip(texts, golden, strict=True):
        found = degenerate_reason(text)
        if (list(found) if found else [None, None]) != [reason, position]:
            changed.append((text[:80], [reason, position], found))
    assert not changed, f"{len(changed)} verdicts changed, e.g. {changed[:3]}"


def test_the_pinned_corpus_reaches_every_rule_and_the_clean_side() -> None:
    reasons = [row[1] or "" for row in json.loads(GOLDEN.read_text("utf-8"))]
    for rule in ("repetition loop", "the same segment", "low diversity", "tag soup", "replacement"):
        assert sum(rule in r for r in reasons) >= 10, rule
    assert reasons.count("") >= 500  # and many texts that must stay clean

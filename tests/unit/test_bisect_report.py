"""bisect/report.py: a probe and an answer in words, nothing blamed unless found."""

from __future__ import annotations

from dsv4_operator.bisect import search
from dsv4_operator.bisect.delta import compute_delta
from dsv4_operator.bisect.outcome import Outcome, ProbeJudge, judge
from dsv4_operator.bisect.report import answer_text, probe_text
from tests.support.builders import example_doc, with_changes

GOOD = example_doc()["spec"]
DELTA = compute_delta(
    GOOD,
    with_changes(
        GOOD,
        {
            "engine.indexKDtype": "bf16",
            "engine.overlap.multiStream": True,
            "safety.acknowledge": ["DSV4-R002"],
        },
    ),
)


def test_a_found_culprit_names_each_setting_with_both_values() -> None:
    state, probes = search.next_probes(search.start(["engine.indexKDtype"], 5), 1)
    _, evidence = judge(20, 60, ProbeJudge(threshold=0.02, alpha=0.01))
    state = search.record(state, probes[0].probe_id, Outcome.FAIL, evidence)
    state, probes = search.next_probes(state, 1)
    state = search.record(state, probes[0].probe_id, Outcome.FAIL, evidence)
    found = search.answer(state)
    assert found is not None
    text = answer_text(DELTA, found)
    assert text.startswith("answer: culprit found after 2 probes")
    assert "culprit: spec.engine.indexKDtype: fp8 -> bf16" in text
    line = probe_text(DELTA, state.probes[0])
    assert "FAIL: 20/60 leaked: above 2.0%" in line


def test_not_reproduced_blames_nothing_in_words() -> None:
    state, probes = search.next_probes(search.start(DELTA.unit_ids, 5), 1)
    state = search.record(state, probes[0].probe_id, Outcome.PASS)
    found = search.answer(state)
    assert found is not None
    text = answer_text(DELTA, found)
    assert text.startswith("answer: not reproduced (nothing is blamed) after 1 probes")
    assert "culprit" not in text


def test_a_refused_probe_says_it_never_started() -> None:
    refused = search.ProbeRecord(
        probe_id="p2",
        units=["engine.indexKDtype", "engine.overlap.multiStream"],
        purpose=search.Purpose.SUBSET,
        status=search.ProbeStatus.REFUSED,
        reason="DSV4-R002 spec.engine.overlap.multiStream: unsafe",
    )
    text = probe_text(DELTA, refused)
    assert "refused by the rules, never started: DSV4-R002" in text

"""bench/scale.py's account of an idle window's status writes: what a user sees changed, by
field and condition, never the live counts a status also carries."""

from __future__ import annotations

from tests.support.benches import load_bench

bench = load_bench("scale.py")


def _status(blind: str, verdict: str, samples: int) -> dict[str, object]:
    return {
        "phase": "Ready",
        "conditions": [{"type": "GuardBlind", "status": blind, "reason": "Seeing"}],
        "guard": {"revision": "abc", "lastVerdict": verdict, "samples": samples},
    }


def test_a_status_write_is_explained_by_what_a_user_sees_changed() -> None:
    before = {"a": _status("False", "Pass", 36), "b": _status("False", "Pass", 36)}
    after = {"a": _status("True", "Pass", 72), "b": _status("False", "Pass", 72)}
    [(name, change)] = bench.status_changes(before, after)
    assert name == "a"
    assert change == "condition GuardBlind 'False Seeing' -> 'True Seeing'"  # not the samples


def test_a_status_first_seen_is_listed_and_an_unchanged_one_is_not() -> None:
    [(name, change)] = bench.status_changes({}, {"c": {"phase": "Progressing"}})
    assert name == "c" and "phase 'Pending' -> 'Progressing'" in change  # parsed: a default
    assert bench.status_changes({"c": {"phase": "Ready"}}, {"c": {"phase": "Ready"}}) == []

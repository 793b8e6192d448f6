"""bench/scale.py's accounts: an idle window's status writes (what a user sees changed, by
field and condition, never the live counts a status also carries), the children's ratios over
rounds, and the guard's slot histograms over a window (quantiles as Prometheus computes them)."""

from __future__ import annotations

import pytest

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


def test_the_children_figure_is_the_median_over_the_creation_rounds() -> None:
    figures = bench.Figures(100, floor_s=10.0, ideal_s=9.0, operator_s=13.0)
    assert bench.children(figures) == "13.0 s vs 10.0 s (1.30x; ideal controller 9.0 s, 0.90x)"
    figures.rounds = [bench.Round(10.0, 10.0, 15.0), bench.Round(10.0, 8.0, 12.0)]
    figures.rounds.append(bench.Round(10.0, 9.0, 13.0))
    line = bench.children(figures)
    # operator / plain apply: 1.5, 1.2, 1.3; ideal / plain: 1.0, 0.8, 0.9; operator / ideal:
    # 1.5, 1.5, 1.44 -- each the median of its own round's ratios, not of medians of times.
    assert "median of 3 rounds: operator 1.30x (1.20-1.50)" in line
    assert "ideal controller 0.90x (0.80-1.00) of the plain apply" in line
    assert "operator 1.50x (1.44-1.50) of the ideal controller" in line


INF = float("inf")


def test_a_slot_wait_quantile_is_interpolated_as_histogram_quantile_does() -> None:
    buckets = {0.001: 0.0, 0.01: 50.0, 0.1: 90.0, 1.0: 100.0, INF: 100.0}
    assert bench.quantile(0.5, buckets) == pytest.approx(0.01)  # 0.001 + 0.009 x 50/50
    assert bench.quantile(0.9, buckets) == pytest.approx(0.1)
    assert bench.quantile(0.95, buckets) == pytest.approx(0.55)  # halfway through (0.1, 1]
    # Past the highest finite bound: that bound, as Prometheus answers.
    assert bench.quantile(0.9, {1.0: 0.0, 5.0: 0.0, INF: 10.0}) == 5.0
    # The first bucket's lower bound is 0.
    assert bench.quantile(0.5, {0.5: 10.0, 1.0: 10.0, INF: 10.0}) == 0.25


def test_a_window_without_waits_reads_as_none() -> None:
    quiet = {0.5: 0.0, 1.0: 0.0, INF: 0.0}
    assert bench.quantile(0.9, quiet) != bench.quantile(0.9, quiet)  # NaN, as Prometheus
    assert bench.slots_line(quiet) == "none"


def test_a_windows_waits_keep_every_bound_and_give_the_share_over_one_second() -> None:
    before = {"reads": {0.5: 10.0, 1.0: 10.0, 5.0: 10.0, INF: 10.0}}
    after = {"reads": {0.5: 10.0, 1.0: 16.0, 5.0: 20.0, INF: 20.0}}
    window = bench.slots_between(after, before)
    # The bound with no new wait stays (at 0): p50 is interpolated from 0.5, not from 0.
    assert window == {"reads": {0.5: 0.0, 1.0: 6.0, 5.0: 10.0, INF: 10.0}}
    line = bench.slots_line(window["reads"])
    assert line == "p50 0.917 s, p90 4 s, p99 4.9 s; 0.0% within 0.5 s, 40.0% over 1 s; n = 10"

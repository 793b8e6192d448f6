"""bisect/search.py: ddmin finds single and pair culprits exactly, skips what it cannot judge,
blames nothing on noise, and resumes from its JSON state to the same answer."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from dsv4_operator.bisect import search
from dsv4_operator.bisect.outcome import Outcome
from dsv4_operator.bisect.search import BisectState, ProbeStatus, Purpose, Reason

Oracle = Callable[[frozenset[str], str], Outcome]


def units(n: int) -> list[str]:
    return [f"u{i}" for i in range(n)]


def leaks_with(*culprit: str) -> Oracle:
    """A probe fails exactly when it applies every culprit unit."""
    needed = frozenset(culprit)
    return lambda applied, _probe: Outcome.FAIL if needed <= applied else Outcome.PASS


def run(
    state: BisectState,
    oracle: Oracle,
    max_parallel: int = 2,
    refuses: search.Refuses | None = None,
    seen: list[frozenset[str]] | None = None,
) -> BisectState:
    """Drive the search to its answer, recording what the oracle says of each probe."""
    for _ in range(10_000):
        if search.answer(state) is not None:
            return state
        state, probes = search.next_probes(state, max_parallel, refuses)
        for probe in probes:
            applied = frozenset(probe.units)
            if seen is not None:
                seen.append(applied)
            state = search.record(state, probe.probe_id, oracle(applied, probe.probe_id))
    raise AssertionError("the search did not end")


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8, 16])
def test_every_single_culprit_is_found_exactly(size: int) -> None:
    for culprit in units(size):
        state = run(search.start(units(size), budget=200), leaks_with(culprit))
        found = search.answer(state)
        assert found is not None and found.reason is Reason.FOUND, (culprit, found)
        assert found.culprit == [culprit]
        assert found.minimal


@pytest.mark.parametrize("size", [2, 3, 4, 8, 16])
def test_every_two_setting_interaction_is_found_as_the_pair(size: int) -> None:
    for pair in itertools.combinations(units(size), 2):
        state = run(search.start(units(size), budget=400), leaks_with(*pair))
        found = search.answer(state)
        assert found is not None and found.reason is Reason.FOUND, (pair, found)
        assert sorted(found.culprit) == sorted(pair)
        assert found.minimal


def test_the_first_probe_is_the_whole_delta_and_a_pass_blames_nothing() -> None:
    state, probes = search.next_probes(search.start(units(6), budget=20), max_parallel=4)
    assert [(p.purpose, p.units) for p in probes] == [(Purpose.REPRODUCE, units(6))]
    state = search.record(state, probes[0].probe_id, Outcome.PASS)
    found = search.answer(state)
    assert found is not None and found.reason is Reason.NOT_REPRODUCED
    assert found.culprit == [] and found.narrowed_to == []
    assert state.started == 1


def test_a_failure_that_does_not_fail_again_is_never_blamed() -> None:
    """Noise: only the reproduction and one subset fail; the confirmation passes."""
    fails = {"p1", "p2"}  # the reproduction, then the first half
    state = run(
        search.start(units(4), budget=50),
        lambda _applied, probe_id: Outcome.FAIL if probe_id in fails else Outcome.PASS,
        max_parallel=1,
    )
    found = search.answer(state)
    assert found is not None and found.reason is Reason.NOT_REPRODUCED
    assert found.culprit == []
    assert state.probes[-1].purpose is Purpose.CONFIRM


def test_inconclusive_probes_are_skipped_not_counted_as_failures() -> None:
    """Every probe that applies u1 alone or with u0 only is inconclusive: the search still
    finds u2 + u3 and never treats the inconclusive sets as failing."""
    culprit = leaks_with("u2", "u3")

    def oracle(applied: frozenset[str], probe_id: str) -> Outcome:
        if applied <= {"u0", "u1"}:
            return Outcome.INCONCLUSIVE
        return culprit(applied, probe_id)

    state = run(search.start(units(6), budget=100), oracle)
    found = search.answer(state)
    assert found is not None and found.reason is Reason.FOUND
    assert sorted(found.culprit) == ["u2", "u3"]
    skipped = [p for p in state.probes if p.outcome is Outcome.INCONCLUSIVE]
    assert skipped, "the case must exercise an inconclusive probe"


def test_an_inconclusive_reproduction_ends_inconclusive_blaming_nothing() -> None:
    state = run(search.start(units(3), budget=10), lambda _a, _p: Outcome.INCONCLUSIVE)
    found = search.answer(state)
    assert found is not None and found.reason is Reason.INCONCLUSIVE
    assert found.culprit == [] and state.started == 1


def test_refused_sets_are_never_started_and_do_not_decide() -> None:
    refused = frozenset({"u0", "u1"})
    seen: list[frozenset[str]] = []
    state = run(
        search.start(units(4), budget=100),
        leaks_with("u1"),
        refuses=lambda ids: "DSV4-R001 refused" if frozenset(ids) == refused else None,
        seen=seen,
    )
    assert refused not in seen
    records = [p for p in state.probes if frozenset(p.units) == refused]
    assert [p.status for p in records] == [ProbeStatus.REFUSED]
    assert records[0].reason == "DSV4-R001 refused"
    found = search.answer(state)
    assert found is not None and found.culprit == ["u1"]
    assert state.started == len(seen)


def test_budget_exhausted_blames_nothing_and_names_how_far_it_got() -> None:
    state = run(search.start(units(16), budget=5), leaks_with("u3", "u12"))
    found = search.answer(state)
    assert found is not None and found.reason is Reason.BUDGET_EXHAUSTED
    assert found.culprit == []
    assert state.started == 5


def test_stop_cancels_pending_probes_and_ends_budget_exhausted() -> None:
    state, _ = search.next_probes(search.start(units(4), budget=20), 1)
    state = search.stop(state, "the time limit (2h) passed")
    found = search.answer(state)
    assert found is not None and found.reason is Reason.BUDGET_EXHAUSTED
    assert found.detail == "the time limit (2h) passed"
    assert [p.status for p in state.probes] == [ProbeStatus.CANCELLED]


def test_state_round_trips_json_mid_search_and_resumes_to_the_same_answer() -> None:
    oracle = leaks_with("u2", "u6")
    straight = run(search.start(units(8), budget=100), oracle, max_parallel=3)

    state = search.start(units(8), budget=100)
    for step in range(4):
        state, probes = search.next_probes(state, 3)
        # A restart while probes run: only the JSON survives, the probes are asked for again.
        state = BisectState.model_validate_json(state.model_dump_json())
        again = BisectState.model_validate_json(search.next_probes(state, 3)[0].model_dump_json())
        assert [p.probe_id for p in search.next_probes(again, 3)[1]] == [p.probe_id for p in probes]
        for probe in probes[: step % 2 + 1]:
            state = search.record(state, probe.probe_id, oracle(frozenset(probe.units), ""))
    resumed = run(BisectState.model_validate_json(state.model_dump_json()), oracle, 3)
    assert resumed.answer == straight.answer
    assert resumed.answer is not None and sorted(resumed.answer.culprit) == ["u2", "u6"]


def test_the_answer_does_not_depend_on_parallelism() -> None:
    oracle = leaks_with("u1", "u9")
    answers = [search.answer(run(search.start(units(12), 200), oracle, p)) for p in (1, 2, 5)]
    assert {tuple(sorted(a.culprit)) for a in answers if a is not None} == {("u1", "u9")}
    assert all(a is not None for a in answers)


def test_no_units_is_no_delta_and_needs_no_probe() -> None:
    state, probes = search.next_probes(search.start([], budget=5), 2)
    assert probes == []
    found = search.answer(state)
    assert found is not None and found.reason is Reason.NO_DELTA


def test_preview_is_the_reproduction_then_the_first_round() -> None:
    plan = search.preview(units(5), max_parallel=2)
    assert [(p.purpose, p.units) for p in plan] == [
        (Purpose.REPRODUCE, units(5)),
        (Purpose.SUBSET, ["u0", "u1", "u2"]),
        (Purpose.SUBSET, ["u3", "u4"]),
    ]
    assert search.worst_case_probes(5) == 2 + (25 + 15) // 2


def test_a_control_that_fails_too_blames_nothing() -> None:
    """Engines that leak as they start fail every probe, the good spec's included: with the
    control the search ends inconclusive instead of narrowing to the first unit."""
    seen: list[frozenset[str]] = []
    state = run(
        search.start(units(4), budget=20, control=True),
        lambda _applied, _probe: Outcome.FAIL,
        seen=seen,
    )
    found = search.answer(state)
    assert found is not None and found.reason is Reason.INCONCLUSIVE
    assert found.culprit == [] and "not the delta's" in found.detail
    assert seen == [frozenset(units(4)), frozenset()]  # side by side, then nothing more


def test_a_passing_control_lets_the_search_find_the_culprit() -> None:
    state = run(search.start(units(6), budget=40, control=True), leaks_with("u4"), max_parallel=1)
    found = search.answer(state)
    assert found is not None and found.culprit == ["u4"]
    assert [p.purpose for p in state.probes[:2]] == [Purpose.REPRODUCE, Purpose.CONTROL]
    # Without the control the same search takes one probe fewer.
    plain = run(search.start(units(6), budget=40), leaks_with("u4"), max_parallel=1)
    assert plain.started == state.started - 1


def test_a_passing_reproduction_ends_without_waiting_for_the_control() -> None:
    state, probes = search.next_probes(search.start(units(3), 10, control=True), 2)
    assert [p.purpose for p in probes] == [Purpose.REPRODUCE, Purpose.CONTROL]
    state = search.record(state, probes[0].probe_id, Outcome.PASS)
    found = search.answer(state)
    assert found is not None and found.reason is Reason.NOT_REPRODUCED
    assert state.probes[1].status is ProbeStatus.CANCELLED

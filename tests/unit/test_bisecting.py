"""The culprit search's decisions (reconcile/bisecting.py): when it starts, carries on or stops,
its answer in status, the Event and the Bisected condition; and the reconcile pass leaving the
search's fields to the search."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dsv4_operator.api.bisect import BisectSpec, BisectState, CulpritStatus
from dsv4_operator.api.status import (
    Condition,
    DSV4DeploymentStatus,
    GuardStatus,
    QuarantineEntry,
)
from dsv4_operator.api.times import Timestamp
from dsv4_operator.bisect import search
from dsv4_operator.bisect.delta import compute_delta
from dsv4_operator.bisect.outcome import Outcome
from dsv4_operator.reasons import ConditionReason, EventReason, RollbackReason
from dsv4_operator.reconcile.bisecting import (
    Step,
    bisected_condition,
    culprit,
    event,
    machine,
    new_state,
    next_step,
    with_machine,
)
from tests.support.builders import NOW, example_doc, with_changes

ON = BisectSpec(enabled=True, time_limit="1h")
GOOD, BAD = "g00d", "b4d"


def rolled_back(**guard: Any) -> DSV4DeploymentStatus:
    """The status after the guard rolled BAD back to GOOD."""
    return DSV4DeploymentStatus(
        phase="RolledBack",
        last_known_good_revision=GOOD,
        conditions=[Condition(type="RolledBack", status="True", reason="LeakRate", message="x")],
        quarantine=[
            QuarantineEntry(
                hash="older", reason=RollbackReason.OOM, at=Timestamp.of(NOW - timedelta(1))
            ),
            QuarantineEntry(hash=BAD, reason=RollbackReason.LEAK_RATE, at=Timestamp.of(NOW)),
        ],
        guard=GuardStatus(**guard),
    )


def running(generation: int = 3, started: timedelta = timedelta(0)) -> BisectState:
    step = Step("start", good=GOOD, bad=BAD)
    return new_state(step, generation, NOW - started, ["a", "b"], 8)


def test_a_rollback_starts_a_search_only_when_enabled_and_once_per_pair() -> None:
    assert next_step(ON, rolled_back(), 3, NOW) == Step("start", good=GOOD, bad=BAD)
    assert next_step(BisectSpec(), rolled_back(), 3, NOW).kind == "idle"  # off by default
    serving = DSV4DeploymentStatus(phase="Ready", last_known_good_revision=GOOD)
    assert next_step(ON, serving, 3, NOW).kind == "idle"
    answered = CulpritStatus(
        result="NotReproduced", good_revision=GOOD, bad_revision=BAD, at=Timestamp.of(NOW)
    )
    assert next_step(ON, rolled_back(culprit=answered), 3, NOW).kind == "idle"
    other = answered.model_copy(update={"bad_revision": "older"})
    assert next_step(ON, rolled_back(culprit=other), 3, NOW).kind == "start"


def test_a_running_search_stops_on_a_spec_change_turned_off_or_past_its_time() -> None:
    assert next_step(ON, rolled_back(bisect=running()), 3, NOW).kind == "continue"
    changed = next_step(ON, rolled_back(bisect=running()), 4, NOW)
    assert (changed.kind, changed.result) == ("stop", "Stopped")
    assert "generation 3 -> 4" in changed.why
    off = next_step(BisectSpec(), rolled_back(bisect=running()), 3, NOW)
    assert (off.kind, off.result) == ("stop", "Stopped")
    late = next_step(ON, rolled_back(bisect=running(started=timedelta(hours=2))), 3, NOW)
    assert (late.kind, late.result) == ("stop", "TimeLimit")


def test_a_found_culprit_names_its_settings_release_gpu_and_every_probe() -> None:
    good = example_doc()["spec"]
    bad = with_changes(
        good,
        {
            "engine.hicache": {"enabled": True},
            "engine.overlap.multiStream": True,
            "engine.cudaGraphMaxBs": 32,
        },
    )
    delta = compute_delta(good, bad)
    guilty = {u for u in delta.unit_ids if "hicache" in u or "multiStream" in u}
    assert len(guilty) == 2, delta.unit_ids
    state = new_state(Step("start", good=GOOD, bad=BAD), 3, NOW, delta.unit_ids, 30)
    machine_ = machine(state)
    while machine_.answer is None:
        machine_, probes = search.next_probes(machine_, 1, delta.refusal)
        for probe in probes:
            failed = guilty <= set(probe.units)
            machine_ = search.record(
                machine_, probe.probe_id, Outcome.FAIL if failed else Outcome.PASS
            )
    state = with_machine(state, machine_, [])
    assert machine(state) == machine_  # the stored state round-trips
    answer = culprit(state, machine_, delta, "0.5.16", "NVIDIA-H100", NOW)
    assert answer.result == "Found"
    assert len(answer.settings) == 2
    assert any("hicache" in s for s in answer.settings)
    assert any("multiStream" in s for s in answer.settings)
    assert (answer.release, answer.gpu_product) == ("0.5.16", "NVIDIA-H100")
    assert [p.id for p in answer.probes] == [p.probe_id for p in machine_.probes if p.outcome]
    assert {p.outcome for p in answer.probes} == {"pass", "fail"}
    severity, reason, message = event(answer)
    assert (severity, reason) == ("Warning", EventReason.CULPRIT_FOUND)
    assert "NVIDIA-H100" in message
    found = rolled_back(culprit=answer)
    assert bisected_condition(found) == (True, ConditionReason.CULPRIT_IDENTIFIED, message)


def test_a_search_that_does_not_reproduce_blames_nothing() -> None:
    state = running()
    machine_, probes = search.next_probes(machine(state), 1)
    machine_ = search.record(machine_, probes[0].probe_id, Outcome.PASS)
    answer = culprit(state, machine_, None, "0.5.16", "H100", NOW)
    assert (answer.result, answer.settings) == ("NotReproduced", [])
    assert event(answer)[:2] == ("Normal", EventReason.CULPRIT_NOT_FOUND)
    condition = bisected_condition(rolled_back(culprit=answer))
    assert condition is not None and condition[:2] == (False, ConditionReason.NOT_REPRODUCED)


def test_a_stopped_search_says_why_and_blames_nothing() -> None:
    stop = Step("stop", result="TimeLimit", why="the time limit of 1h passed")
    answer = culprit(running(), machine(running()), None, "0.5.16", "H100", NOW, stop)
    assert (answer.result, answer.settings) == ("TimeLimit", [])
    assert "time limit" in answer.message
    condition = bisected_condition(rolled_back(culprit=answer))
    assert condition is not None and condition[:2] == (False, ConditionReason.NO_CULPRIT)


def test_a_running_search_shows_as_bisecting() -> None:
    condition = bisected_condition(rolled_back(bisect=running()))
    assert condition is not None
    assert condition[:2] == (False, ConditionReason.BISECTING)
    assert BAD in condition[2] and GOOD in condition[2]
    assert bisected_condition(DSV4DeploymentStatus()) is None


def test_the_reconcile_pass_leaves_the_search_fields_to_the_search() -> None:
    status = rolled_back(bisect=running(), culprit=None)
    applied = status.reconciled_wire()["guard"]
    assert isinstance(applied, dict) and "bisect" not in applied
    assert "bisect" in status.to_wire()["guard"]  # type: ignore[operator]

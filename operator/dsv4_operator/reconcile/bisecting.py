"""The culprit search's decisions (pure): when a search starts, continues or stops, what its
state and answer look like in status, and the Bisected condition (docs/bisect.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from dsv4_operator.api.bisect import (
    BisectSpec,
    BisectState,
    CulpritResult,
    CulpritStatus,
    ProbeEvidence,
)
from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.api.times import Timestamp
from dsv4_operator.bisect import search
from dsv4_operator.bisect.delta import Delta
from dsv4_operator.reasons import ConditionReason, EventReason

StepKind = Literal["idle", "start", "continue", "stop"]


@dataclass(frozen=True)
class Step:
    """What the search of one deployment does next."""

    kind: StepKind
    good: str | None = None  # start: the last known good revision
    bad: str | None = None  # start: the rolled-back revision
    result: CulpritResult | None = None  # stop: how it ends
    why: str = ""


def rolled_back_revision(status: DSV4DeploymentStatus) -> str | None:
    """The revision the guard rolled back from, while the rollback stands (RolledBack=True)."""
    rolled = any(c.type == "RolledBack" and c.status == "True" for c in status.conditions)
    if not rolled or not status.quarantine or not status.last_known_good_revision:
        return None
    return max(status.quarantine, key=lambda q: q.at.at).hash


def next_step(
    policy: BisectSpec, status: DSV4DeploymentStatus, generation: int, now: datetime
) -> Step:
    """Start after a rollback when enabled, once per (good, bad) pair; stop when turned off, when
    the spec changed since the start, or past the time limit; else carry on."""
    guard = status.guard
    state = guard.bisect if guard is not None else None
    if state is not None:
        if not policy.enabled:
            return Step("stop", result="Stopped", why="spec.guard.bisect was turned off")
        if state.generation != generation:
            return Step(
                "stop",
                result="Stopped",
                why=f"the spec changed (generation {state.generation} -> {generation})",
            )
        if now - state.started_at.at > policy.time_limit.delta:
            return Step(
                "stop", result="TimeLimit", why=f"the time limit of {policy.time_limit} passed"
            )
        return Step("continue")
    bad = rolled_back_revision(status)
    if not policy.enabled or bad is None:
        return Step("idle")
    good = status.last_known_good_revision
    done = guard.culprit if guard is not None else None
    if done is not None and (done.good_revision, done.bad_revision) == (good, bad):
        return Step("idle")  # answered for this pair already
    return Step("start", good=good, bad=bad)


def new_state(
    step: Step, generation: int, now: datetime, units: list[str], budget: int
) -> BisectState:
    """The stored state of a search that starts now over `units`."""
    assert step.good is not None and step.bad is not None
    machine = search.start(units, budget)
    return BisectState(
        good_revision=step.good,
        bad_revision=step.bad,
        generation=generation,
        started_at=Timestamp.of(now),
        search=machine.model_dump(mode="json"),
    )


def machine(state: BisectState) -> search.BisectState:
    """The ddmin state machine stored in `state`."""
    return search.BisectState.model_validate(state.search)


def with_machine(state: BisectState, running: search.BisectState, active: list[str]) -> BisectState:
    """`state` holding `running`, the probes whose shadow pairs exist and every finished one."""
    return state.model_copy(
        update={"search": running.model_dump(mode="json"), "active": sorted(active)}
    )


def setting(delta: Delta, unit_id: str) -> str:
    """A unit as a person reads it: `name: good -> bad`."""
    unit = delta.unit(unit_id)
    return f"{unit.name}: {unit.good or '(unset)'} -> {unit.bad or '(unset)'}"


def evidence(running: search.BisectState, delta: Delta) -> list[ProbeEvidence]:
    """Every finished probe with its settings and what its canary saw."""
    out: list[ProbeEvidence] = []
    for probe in running.probes:
        if probe.outcome is None:
            continue
        seen = probe.evidence
        out.append(
            ProbeEvidence(
                id=probe.probe_id,
                settings=[setting(delta, u) for u in probe.units],
                outcome=probe.outcome.value,
                responses=seen.responses if seen else 0,
                leaks=seen.leaks if seen else 0,
                statistic=seen.log_evidence_above if seen else None,
                message=(seen.detail if seen else probe.reason)[:4096],
            )
        )
    return out


_RESULTS: dict[search.Reason, CulpritResult] = {
    search.Reason.FOUND: "Found",
    search.Reason.NOT_REPRODUCED: "NotReproduced",
    search.Reason.NO_DELTA: "NoDelta",
    search.Reason.INCONCLUSIVE: "Inconclusive",
    search.Reason.BUDGET_EXHAUSTED: "Budget",
}


def culprit(
    state: BisectState,
    running: search.BisectState,
    delta: Delta | None,
    release: str,
    gpu_product: str,
    now: datetime,
    stopped: Step | None = None,
) -> CulpritStatus:
    """The answer of a search that ended (by its own answer, or `stopped`)."""
    answer = running.answer
    if stopped is not None and stopped.result is not None:
        result: CulpritResult = stopped.result
        message = f"no culprit: {stopped.why}"
    else:
        assert answer is not None
        result = _RESULTS[answer.reason]
        message = answer.detail
    blamed = answer.culprit if answer is not None and result == "Found" else []
    settings = [setting(delta, u) for u in blamed] if delta is not None else list(blamed)
    if result == "Found":
        verb = "leaks" if len(settings) == 1 else "leak together"
        message = f"{' + '.join(settings)} {verb} on {gpu_product}, SGLang {release}"
    return CulpritStatus(
        result=result,
        settings=settings,
        release=release,
        gpu_product=gpu_product,
        good_revision=state.good_revision,
        bad_revision=state.bad_revision,
        message=message[:4096],
        probes=evidence(running, delta) if delta is not None else [],
        at=Timestamp.of(now),
    )


def event(answer: CulpritStatus) -> tuple[Literal["Normal", "Warning"], EventReason, str]:
    """The Event that announces a search's end."""
    if answer.result == "Found":
        return "Warning", EventReason.CULPRIT_FOUND, answer.message
    return (
        "Normal",
        EventReason.CULPRIT_NOT_FOUND,
        f"{answer.result}: {answer.message} (revision {answer.bad_revision})",
    )


def bisected_condition(
    status: DSV4DeploymentStatus,
) -> tuple[bool, ConditionReason, str] | None:
    """Bisected (status, reason, message) from status.guard, None before any search."""
    guard = status.guard
    if guard is None:
        return None
    if guard.bisect is not None:
        finished = sum(1 for _ in machine(guard.bisect).probes if _.outcome is not None)
        return (
            False,
            ConditionReason.BISECTING,
            f"searching revision {guard.bisect.bad_revision} against "
            f"{guard.bisect.good_revision}: {finished} probes finished, "
            f"{len(guard.bisect.active)} running",
        )
    answer = guard.culprit
    if answer is None:
        return None
    if answer.result == "Found":
        return True, ConditionReason.CULPRIT_IDENTIFIED, answer.message
    reason = (
        ConditionReason.NOT_REPRODUCED
        if answer.result in ("NotReproduced", "NoDelta")
        else ConditionReason.NO_CULPRIT
    )
    return False, reason, f"{answer.result}: {answer.message}"

"""Delta debugging (Zeller's ddmin) over configuration units as a resumable state machine.

The whole search state is one pydantic model (`BisectState`) that round-trips through JSON:
the operator keeps it in status and resumes after a restart, `dsv4 bisect` runs it in a loop.
Units are opaque ids here (bisect/delta.py makes them); a probe applies a subset of them to
the last known good spec. Usage:

    state = start(unit_ids, budget=20)
    while answer(state) is None:
        state, probes = next_probes(state, max_parallel=2, refuses=delta.refusal)
        ...run each probe, then: state = record(state, probe.probe_id, outcome, evidence)

docs/bisect.md explains the algorithm and why noise is never blamed on a setting.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from enum import StrEnum

from pydantic import Field

from dsv4_operator.bisect import BisectModel
from dsv4_operator.bisect.outcome import Outcome, ProbeEvidence

# Given a probe's unit ids: why the project's rules refuse that configuration, or None.
Refuses = Callable[[list[str]], str | None]


class Purpose(StrEnum):
    """Why a probe runs."""

    REPRODUCE = "reproduce"  # the whole delta: does the rejected configuration fail here?
    SUBSET = "subset"  # one part of the current failing set (ddmin "reduce to subset")
    COMPLEMENT = "complement"  # the current set without one part ("reduce to complement")
    CONFIRM = "confirm"  # the minimal failing set again, before anything is blamed
    CONTROL = "control"  # no unit: the good spec on a fresh probe must not fail (opt-in)


class ProbeStatus(StrEnum):
    PENDING = "pending"  # started (or to be started), no outcome yet
    DONE = "done"
    CANCELLED = "cancelled"  # its round was decided without it: stop it, its result is unused
    REFUSED = "refused"  # the rules refuse the configuration: never started, skipped


class Phase(StrEnum):
    REPRODUCE = "reproduce"
    REDUCE = "reduce"
    CONFIRM = "confirm"
    DONE = "done"


class Reason(StrEnum):
    """How a search ended."""

    FOUND = "found"
    NOT_REPRODUCED = "notReproduced"
    BUDGET_EXHAUSTED = "budgetExhausted"
    INCONCLUSIVE = "inconclusive"
    NO_DELTA = "noDelta"


class ProbeRequest(BisectModel):
    """A probe to run: the good spec with these units applied (bisect/delta.py)."""

    probe_id: str
    units: list[str]
    purpose: Purpose


class ProbeRecord(BisectModel):
    """One probe of the search, with its outcome and evidence once known."""

    probe_id: str
    units: list[str]
    purpose: Purpose
    status: ProbeStatus = ProbeStatus.PENDING
    outcome: Outcome | None = None
    evidence: ProbeEvidence | None = None
    reason: str = Field(default="", description="Why it was refused or cancelled.")


class BisectAnswer(BisectModel):
    """The culprit units, or why there is none (then `culprit` is empty: nothing is blamed)."""

    reason: Reason
    culprit: list[str] = Field(default_factory=list)
    narrowed_to: list[str] = Field(
        default_factory=list,
        description="The smallest set that failed (the culprit when found; otherwise not "
        "blamed, only a hint).",
    )
    minimal: bool = Field(
        default=False,
        description="Removing any one culprit unit was shown to pass (1-minimal); false when "
        "some of those probes were skipped (inconclusive or refused).",
    )
    probes_started: int = 0
    detail: str = ""


class BisectState(BisectModel):
    """Everything the search needs to resume: JSON in, JSON out."""

    units: list[str]
    budget: int = Field(ge=1, description="The most probes that may be started.")
    phase: Phase = Phase.REPRODUCE
    current: list[str] = Field(default_factory=list, description="The current failing set.")
    granularity: int = 2
    control: bool = Field(
        default=False,
        description="Probe the good spec too (no unit) before reducing: if it fails, the leak "
        "is not the delta's and nothing is blamed.",
    )
    probes: list[ProbeRecord] = Field(default_factory=list)
    answer: BisectAnswer | None = None

    @property
    def started(self) -> int:
        return sum(p.status is not ProbeStatus.REFUSED for p in self.probes)

    @property
    def pending(self) -> list[ProbeRecord]:
        return [p for p in self.probes if p.status is ProbeStatus.PENDING]


def start(units: Sequence[str], budget: int, control: bool = False) -> BisectState:
    """A new search over `units` (ordered, unique), at most `budget` probes started. With
    `control`, the good spec is probed beside the reproduction (ddmin assumes it passes)."""
    if len(set(units)) != len(units):
        raise ValueError("unit ids must be unique")
    state = BisectState(units=list(units), budget=budget, current=list(units), control=control)
    if not units:
        state.phase = Phase.DONE
        state.answer = BisectAnswer(
            reason=Reason.NO_DELTA, detail="the two specs run the same engines: nothing to bisect"
        )
    return state


def answer(state: BisectState) -> BisectAnswer | None:
    """The search's answer once it has ended."""
    return state.answer


def next_probes(
    state: BisectState, max_parallel: int, refuses: Refuses | None = None
) -> tuple[BisectState, list[ProbeRequest]]:
    """The probes that should be running now: those pending plus new ones, at most
    `max_parallel` in all. Idempotent: after a restart it returns the pending probes again.

    A configuration `refuses` names a reason for is recorded as refused and never started.
    """
    if max_parallel < 1:
        raise ValueError("max_parallel must be at least 1")
    state = state.model_copy(deep=True)
    while state.answer is None:
        wanted = _advance(state)
        if state.answer is not None or not wanted:
            break
        room = max_parallel - len(state.pending)
        progressed = False
        for purpose, units in wanted:
            if room <= 0:
                break
            why = refuses(units) if refuses is not None and purpose is not Purpose.CONFIRM else None
            if why is not None:
                state.probes.append(_new(state, units, purpose, ProbeStatus.REFUSED, why))
                progressed = True
                break  # a refusal is a skip: the round may be decided now
            if state.started >= state.budget:
                break
            state.probes.append(_new(state, units, purpose, ProbeStatus.PENDING))
            room -= 1
        if not progressed:
            break
    _settle(state)
    return state, [
        ProbeRequest(probe_id=p.probe_id, units=p.units, purpose=p.purpose) for p in state.pending
    ]


def record(
    state: BisectState, probe_id: str, outcome: Outcome, evidence: ProbeEvidence | None = None
) -> BisectState:
    """The outcome of a started probe. A cancelled probe's result is kept but not used."""
    state = state.model_copy(deep=True)
    probe = next((p for p in state.probes if p.probe_id == probe_id), None)
    if probe is None:
        raise ValueError(f"no probe {probe_id!r} in this search")
    if probe.status is ProbeStatus.REFUSED:
        raise ValueError(f"probe {probe_id!r} was refused by the rules and never started")
    if probe.outcome is not None:
        return state  # a repeated report (e.g. after a restart) changes nothing
    probe.outcome, probe.evidence = outcome, evidence
    if probe.status is ProbeStatus.PENDING:
        probe.status = ProbeStatus.DONE
    _advance(state)  # a budget end waits for next_probes: the next set may be refused (free)
    return state


def stop(state: BisectState, detail: str) -> BisectState:
    """End the search without a culprit (e.g. its time limit passed): budget exhausted."""
    state = state.model_copy(deep=True)
    if state.answer is None:
        for probe in state.pending:
            probe.status, probe.reason = ProbeStatus.CANCELLED, "the search stopped"
        _end(state, Reason.BUDGET_EXHAUSTED, detail)
    return state


def worst_case_probes(units: int) -> int:
    """The most probes a search over `units` can start: reproduce, ddmin's worst case
    ((n^2 + 3n) / 2 tests, Zeller and Hildebrandt 2002) and the confirmation."""
    return 2 + (units * units + 3 * units) // 2 if units else 0


def lower_bound(candidates: int) -> float:
    """Probes any pass/fail search needs to tell `candidates` possible culprits apart."""
    return math.log2(candidates) if candidates > 1 else 0.0


def preview(
    units: Sequence[str], max_parallel: int, refuses: Refuses | None = None, control: bool = False
) -> list[ProbeRequest]:
    """The first probes of a search: the reproduction (and the control), then, should the
    reproduction fail (and the control pass), the first round."""
    budget = max(1, worst_case_probes(len(units)) + control)
    state, first = next_probes(start(units, budget, control), 2, refuses)
    for probe in first:
        failed = probe.purpose is Purpose.REPRODUCE
        state = record(state, probe.probe_id, Outcome.FAIL if failed else Outcome.PASS)
    _, round_one = next_probes(state, max_parallel, refuses)
    return [*first, *round_one]


# --- the state machine -------------------------------------------------------------------


def _new(
    state: BisectState,
    units: list[str],
    purpose: Purpose,
    status: ProbeStatus,
    reason: str = "",
) -> ProbeRecord:
    return ProbeRecord(
        probe_id=f"p{len(state.probes) + 1}",
        units=units,
        purpose=purpose,
        status=status,
        reason=reason,
    )


def _key(units: Sequence[str]) -> frozenset[str]:
    return frozenset(units)


def _resolution(state: BisectState, units: list[str]) -> Outcome | ProbeStatus | None:
    """A set's known result: its first finished probe's outcome, REFUSED, PENDING or None."""
    key = _key(units)
    for probe in state.probes:
        if _key(probe.units) != key or probe.purpose is Purpose.CONFIRM:
            continue
        if probe.status is ProbeStatus.DONE:
            return probe.outcome
        if probe.status in (ProbeStatus.REFUSED, ProbeStatus.PENDING):
            return probe.status
    return None


def _candidates(current: list[str], n: int) -> list[tuple[Purpose, list[str]]]:
    """ddmin's tests at granularity n: the n parts, then (n > 2) the n complements."""
    size, extra = divmod(len(current), n)
    parts, at = [], 0
    for i in range(n):
        width = size + (1 if i < extra else 0)
        parts.append(current[at : at + width])
        at += width
    out: list[tuple[Purpose, list[str]]] = [(Purpose.SUBSET, part) for part in parts]
    if n > 2:
        out += [(Purpose.COMPLEMENT, [u for u in current if u not in part]) for part in parts]
    return out


def _advance(state: BisectState) -> list[tuple[Purpose, list[str]]]:
    """Decide whatever the recorded outcomes decide; return the sets that still need a probe,
    in ddmin's order (a round is decided by its first failing test in that order, so the
    answer does not depend on how many probes ran in parallel or in which order they ended)."""
    while state.answer is None:
        if state.phase is Phase.REPRODUCE:
            wanted = _reproduce(state)
            if wanted is not None:
                return wanted
        elif state.phase is Phase.REDUCE:
            wanted = _reduce(state)
            if wanted is not None:
                return wanted
        elif state.phase is Phase.CONFIRM:
            probe = next(
                (
                    p
                    for p in state.probes
                    if p.purpose is Purpose.CONFIRM and _key(p.units) == _key(state.current)
                ),
                None,
            )
            if probe is None:
                return [(Purpose.CONFIRM, list(state.current))]
            if probe.status is ProbeStatus.PENDING:
                return []
            _after_confirm(state, probe)
    return []


def _settle(state: BisectState) -> None:
    """Decide what can be decided; end the search when it needs a probe the budget lacks."""
    wanted = _advance(state)
    if wanted and not state.pending and state.started >= state.budget:
        _end(state, Reason.BUDGET_EXHAUSTED, f"all {state.budget} probes of the budget were used")


def _first(state: BisectState, purpose: Purpose) -> ProbeRecord | None:
    return next((p for p in state.probes if p.purpose is purpose), None)


def _reproduce(state: BisectState) -> list[tuple[Purpose, list[str]]] | None:
    """The reproduction (and the control, side by side); None once they decided."""
    probe, control = _first(state, Purpose.REPRODUCE), _first(state, Purpose.CONTROL)
    wanted: list[tuple[Purpose, list[str]]] = []
    if probe is None:
        wanted.append((Purpose.REPRODUCE, list(state.units)))
    if state.control and control is None:
        wanted.append((Purpose.CONTROL, []))
    if probe is None or probe.status is ProbeStatus.PENDING:
        return wanted
    if probe.outcome is Outcome.FAIL and state.control:
        if control is None or control.status is ProbeStatus.PENDING:
            return wanted
        if control.outcome is Outcome.FAIL:
            _end(
                state,
                Reason.INCONCLUSIVE,
                "the last known good configuration failed on its own probe too: the leak is "
                "not the delta's (the environment, or engines that leak as they start), so "
                "nothing is blamed",
            )
            return None
    _after_reproduce(state, probe)
    return None


def _after_reproduce(state: BisectState, probe: ProbeRecord) -> None:
    if probe.status is ProbeStatus.REFUSED:
        _end(
            state,
            Reason.INCONCLUSIVE,
            f"the rules refuse the rejected configuration itself: {probe.reason}",
        )
    elif probe.outcome is Outcome.PASS:
        _end(
            state,
            Reason.NOT_REPRODUCED,
            "the rejected configuration did not fail on the probe: "
            "the leak did not reproduce, so nothing is blamed",
        )
    elif probe.outcome is Outcome.INCONCLUSIVE:
        _end(state, Reason.INCONCLUSIVE, "the rejected configuration's probe was inconclusive")
    else:
        state.current = list(state.units)
        state.granularity = 2
        state.phase = Phase.CONFIRM if len(state.units) == 1 else Phase.REDUCE


def _reduce(state: BisectState) -> list[tuple[Purpose, list[str]]] | None:
    """One step of ddmin; the sets to probe when the round is not decided yet, else None."""
    wanted: list[tuple[Purpose, list[str]]] = []
    waiting = False
    for purpose, units in _candidates(state.current, state.granularity):
        result = _resolution(state, units)
        if result is None:
            wanted.append((purpose, units))
            waiting = True
        elif result is ProbeStatus.PENDING:
            waiting = True
        elif result is Outcome.FAIL:
            if waiting:
                break  # an earlier test may still decide the round; later ones are not needed
            _adopt(state, purpose, units)
            return None
    if waiting:
        return wanted
    if state.granularity < len(state.current):
        state.granularity = min(len(state.current), 2 * state.granularity)
    else:
        state.phase = Phase.CONFIRM
    return None


def _adopt(state: BisectState, purpose: Purpose, units: list[str]) -> None:
    """The failing set becomes the current one; probes of the old round are not needed."""
    n = 2 if purpose is Purpose.SUBSET else max(state.granularity - 1, 2)
    state.current, state.granularity = units, min(n, max(len(units), 1))
    for probe in state.pending:
        if probe.purpose in (Purpose.SUBSET, Purpose.COMPLEMENT):
            probe.status, probe.reason = ProbeStatus.CANCELLED, "its round was decided"
    if len(units) == 1:
        state.phase = Phase.CONFIRM
    else:
        state.granularity = max(state.granularity, 2)


def _after_confirm(state: BisectState, probe: ProbeRecord) -> None:
    culprit = list(state.current)
    if probe.outcome is Outcome.FAIL:
        minimal = _minimal(state, culprit)
        state.phase = Phase.DONE
        state.answer = BisectAnswer(
            reason=Reason.FOUND,
            culprit=culprit,
            narrowed_to=culprit,
            minimal=minimal,
            probes_started=state.started,
            detail="failed twice, on its own probe and on the confirmation"
            + ("" if minimal else "; some smaller sets were skipped, so a subset may also fail"),
        )
    elif probe.outcome is Outcome.PASS:
        _end(
            state,
            Reason.NOT_REPRODUCED,
            "the smallest failing set passed its confirmation: "
            "its failure did not reproduce, so nothing is blamed",
        )
    else:
        _end(
            state,
            Reason.INCONCLUSIVE,
            "the confirmation of the smallest failing set was inconclusive, so nothing is blamed",
        )


def _minimal(state: BisectState, culprit: list[str]) -> bool:
    """Each set with one unit fewer was shown to pass (the empty set is the good spec)."""
    if len(culprit) == 1:
        return True
    return all(
        _resolution(state, [u for u in culprit if u != removed]) is Outcome.PASS
        for removed in culprit
    )


def _end(state: BisectState, reason: Reason, detail: str) -> None:
    for probe in state.pending:
        probe.status, probe.reason = ProbeStatus.CANCELLED, "the search ended"
    state.phase = Phase.DONE
    state.answer = BisectAnswer(
        reason=reason,
        narrowed_to=list(state.current) if state.current != state.units else [],
        probes_started=state.started,
        detail=detail,
    )

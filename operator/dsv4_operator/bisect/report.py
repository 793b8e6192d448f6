"""Bisection in words: the units, the probe plan, each probe and the answer (pure text)."""

from __future__ import annotations

from collections.abc import Sequence

from dsv4_operator.bisect.delta import Delta
from dsv4_operator.bisect.search import (
    BisectAnswer,
    ProbeRecord,
    ProbeRequest,
    ProbeStatus,
    Reason,
    lower_bound,
    worst_case_probes,
)

REASON_TEXT = {
    Reason.FOUND: "culprit found",
    Reason.NOT_REPRODUCED: "not reproduced (nothing is blamed)",
    Reason.BUDGET_EXHAUSTED: "budget exhausted (nothing is blamed)",
    Reason.INCONCLUSIVE: "inconclusive (nothing is blamed)",
    Reason.NO_DELTA: "no delta (both specs run the same engines)",
}


def _value(text: str | None) -> str:
    return "(unset)" if text is None else text


def units_text(delta: Delta) -> str:
    """One line per unit: id, the name a person knows it by, good -> rejected value."""
    if not delta.units:
        return "units: none (the two specs run the same engines)"
    lines = [f"units ({len(delta.units)}):"]
    for index, unit in enumerate(delta.units, start=1):
        lines.append(
            f"  {index:>2}. {unit.name}: {_value(unit.good)} -> {_value(unit.bad)}  [{unit.id}]"
        )
    return "\n".join(lines)


def names(delta: Delta, unit_ids: Sequence[str]) -> str:
    """The units' human names, comma-separated ("none" for the good spec itself)."""
    return ", ".join(delta.unit(u).name for u in unit_ids) or "none (the good spec)"


def plan_text(
    delta: Delta, first: Sequence[ProbeRequest], max_parallel: int, control: bool = False
) -> str:
    """The dry run: the first probes (the reproduction, then the first round should it
    fail) and the worst-case probe count against the lower bounds."""
    n, pairs = len(delta.units), len(delta.units) * (len(delta.units) - 1) // 2
    lines = [f"probe plan (up to {max_parallel} at once):"]
    for index, request in enumerate(first):
        if index == 1 + control:
            lines.append("  if p1 fails" + (" and p2 passes:" if control else ":"))
        lines.append(
            f"  {request.probe_id} {request.purpose.value:<10} "
            f"{names(delta, request.units) if request.units else 'none (the good spec)'}"
        )
    lines.append(
        f"worst case {worst_case_probes(n) + control} probes; lower bounds: a single culprit about "
        f"log2({n}) = {lower_bound(n):.1f}, a pair about log2({pairs}) = {lower_bound(pairs):.1f}"
    )
    return "\n".join(lines)


def probe_text(delta: Delta, probe: ProbeRecord) -> str:
    """One probe: what it applied and what it showed."""
    head = f"{probe.probe_id} {probe.purpose.value:<10} {names(delta, probe.units)}"
    if probe.status is ProbeStatus.REFUSED:
        return f"{head}\n    refused by the rules, never started: {probe.reason}"
    if probe.outcome is None:
        return f"{head}\n    {probe.status.value}"
    detail = probe.evidence.detail if probe.evidence is not None else ""
    unused = " (cancelled: not used)" if probe.status is ProbeStatus.CANCELLED else ""
    return f"{head}\n    {probe.outcome.value.upper()}{unused}: {detail}"


def answer_text(delta: Delta, answer: BisectAnswer) -> str:
    """The verdict: the culprit settings with both values, or why there is none."""
    lines = [f"answer: {REASON_TEXT[answer.reason]} after {answer.probes_started} probes"]
    if answer.culprit:
        for unit_id in answer.culprit:
            unit = delta.unit(unit_id)
            lines.append(f"  culprit: {unit.name}: {_value(unit.good)} -> {_value(unit.bad)}")
    elif answer.narrowed_to:
        lines.append(f"  last failing set (not blamed): {names(delta, answer.narrowed_to)}")
    if answer.detail:
        lines.append(f"  {answer.detail}")
    return "\n".join(lines)

"""Culprit bisection after a rollback: its settings (`spec.guard.bisect`), its resumable state
and its answer (`status.guard.bisect`, `status.guard.culprit`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from dsv4_operator.api.base import ApiModel
from dsv4_operator.api.limits import MAX_LIST_ITEMS, BisectTimeLimit
from dsv4_operator.api.times import Duration, Timestamp

MAX_BISECT_PROBES = 256
MAX_BISECT_PARALLEL = 8
# A DNS-1123 subdomain, as a PriorityClass name must be.
PRIORITY_CLASS_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"


class BisectSpec(ApiModel):
    """Which settings of a rolled-back revision leak, on shadow pairs beside the serving one."""

    enabled: bool = Field(
        default=False,
        description="After the guard rolls a revision back to the last known good one, bisect "
        "the configuration delta between them (delta debugging) on shadow prefill/decode pairs "
        "to find the settings that leak; status.guard.culprit has the answer (docs/bisect.md).",
    )
    max_probes: int = Field(
        default=24,
        ge=1,
        le=MAX_BISECT_PROBES,
        description="Probe configurations to try at most; the search then ends Budget.",
    )
    max_parallel: int = Field(
        default=1,
        ge=1,
        le=MAX_BISECT_PARALLEL,
        description="Shadow pairs (a probe's prefill and decode) running at once.",
    )
    max_gpus: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="GPUs the shadow pairs may hold together; unset: maxParallel pairs' worth. "
        "A probe that would exceed it waits for one to finish.",
    )
    time_limit: BisectTimeLimit = Field(
        default=Duration("2h"),
        description="Wall time the search may take from its start (10m to 168h); it then ends "
        "TimeLimit with what it found so far.",
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=PRIORITY_CLASS_PATTERN,
        description="PriorityClass of the shadow pairs' pods: lower than serving and "
        "preemptionPolicy Never, so a probe only uses free capacity; unset: the chart's "
        "(DSV4_BISECT_PRIORITY_CLASS: `<release>-bisect` from the chart, `dsv4-bisect` "
        "without it).",
    )


ProbeOutcome = Literal["pass", "fail", "inconclusive"]
CulpritResult = Literal[
    "Found", "NotReproduced", "NoDelta", "Inconclusive", "Budget", "TimeLimit", "Stopped"
]
Setting = Annotated[str, Field(max_length=1024)]


class ProbeEvidence(ApiModel):
    """One probe: the configuration it ran and what its canary saw."""

    id: str = Field(max_length=63, description="Probe id (its shadow pair's name suffix).")
    settings: list[Setting] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="The delta's units applied to the last known good configuration.",
    )
    outcome: ProbeOutcome = Field(description="pass, fail or inconclusive (never a failure).")
    responses: int = Field(default=0, ge=0, description="Canary responses judged.")
    leaks: int = Field(default=0, ge=0, description="Of those, leaked ones.")
    statistic: float | None = Field(
        default=None, description="The sequential test's statistic at the end of the probe."
    )
    message: str = Field(default="", max_length=4096, description="Why this outcome.")


class CulpritStatus(ApiModel):
    """What a finished bisection found, or why it found nothing."""

    result: CulpritResult = Field(
        description="Found; NotReproduced (the rejected configuration did not leak again: "
        "nothing is blamed); NoDelta (both revisions run the same engines); Inconclusive, Budget, "
        "TimeLimit or Stopped (no answer)."
    )
    settings: list[Setting] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="The smallest set of settings that leaks together (Found only).",
    )
    release: str | None = Field(default=None, description="SGLang release of the search.")
    gpu_product: str | None = Field(default=None, description="GPU product it ran on.")
    good_revision: str = Field(description="Last known good revision (the search's base).")
    bad_revision: str = Field(description="The rolled-back revision.")
    message: str = Field(default="", max_length=4096, description="The answer in words.")
    probes: list[ProbeEvidence] = Field(
        default_factory=list,
        max_length=MAX_BISECT_PROBES,
        description="Every probe, in the order they finished, with its evidence.",
    )
    at: Timestamp = Field(description="When the search ended.")


class BisectState(ApiModel):
    """A running search, stored so it resumes after an operator restart."""

    good_revision: str = Field(description="Last known good revision (the base).")
    bad_revision: str = Field(description="The rolled-back revision.")
    generation: int = Field(description="The spec generation the search started for.")
    started_at: Timestamp = Field(description="When the search started.")
    search: dict[str, Any] = Field(
        default_factory=dict,
        description="The delta-debugging state (bisect/search.py): units, every probe with its "
        "outcome and evidence, the current failing set and granularity.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    active: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list,
        max_length=MAX_BISECT_PARALLEL,
        description="Probes whose shadow pairs exist (run again from their start after a restart).",
    )

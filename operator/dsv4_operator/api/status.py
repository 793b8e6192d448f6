"""Typed `DSV4Deployment.status`, rebuilt from the world on every reconcile pass."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, WithJsonSchema

from dsv4_operator.api.base import ApiModel
from dsv4_operator.api.bisect import BisectState, CulpritStatus
from dsv4_operator.api.times import Timestamp
from dsv4_operator.reasons import GuardReason, GuardResult, Reason, RollbackReason

log = logging.getLogger(__name__)

Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "Failed", "RolledBack", "Invalid"]
ConditionType = Literal[
    "Validated",
    "Ready",
    "Progressing",
    "Degraded",
    "RolledBack",
    "GuardBlind",
    "MonitoringReady",
    "WeightsReady",
    "PlanVerified",
    "LeakShapesVisible",
    "InUse",
    "Bisected",
]
Severity = Literal["error", "warning"]
# Guard verdicts typed with the catalogue's enums (reasons.py) and written as their values; the
# CRD keeps these fields plain strings, as they always were (an `enum:` would change it).
# A value the catalogue does not know (written by a newer operator, read after a downgrade) is
# kept as the string it is: one unknown reason must not make the whole status unparseable, which
# would drop the quarantine and roll a rejected revision out again.
_WireString = WithJsonSchema({"type": "string"})


def _known(catalogue: type[Reason]) -> BeforeValidator:
    def member(value: Any) -> Any:
        return catalogue(value) if value in catalogue._value2member_map_ else value

    return BeforeValidator(member)


Verdict = Annotated[GuardResult | str, _known(GuardResult), _WireString]
VerdictReason = Annotated[GuardReason | str, _known(GuardReason), _WireString]
QuarantineReason = Annotated[RollbackReason | str, _known(RollbackReason), _WireString]


class Condition(ApiModel):
    """A metav1.Condition-shaped condition."""

    type: ConditionType = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase machine-readable reason.")
    message: str = Field(default="", description="Human-readable explanation.")
    last_transition_time: Timestamp | None = Field(
        default=None, description="RFC 3339 time of the change."
    )
    observed_generation: int | None = Field(
        default=None, description="Generation it was computed for."
    )


class Finding(ApiModel):
    """One rule finding on the spec."""

    rule: str = Field(description="Rule id (DSV4-Rxxx) or `schema`.")
    severity: Severity = Field(description="error or warning (after safety policy).")
    field: str = Field(description="Spec field path the finding is about.")
    message: str = Field(description="What breaks and what to do.")


class RoleNumbers(ApiModel):
    """An int per role."""

    prefill: int = Field(description="Prefill.")
    decode: int = Field(description="Decode.")


class PlanStatus(ApiModel):
    """The memory plan the engines were launched with."""

    sglang_version: str | None = Field(
        default=None, description="SGLang release whose pool arithmetic the plan follows."
    )
    bytes_per_token: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Bytes per full token by pool (swa, c4, c128, indexer, ..., total), per role.",
    )
    max_total_tokens: RoleNumbers | None = Field(
        default=None, description="--max-total-tokens per rank, per role."
    )
    sessions_capacity: int | None = Field(default=None, description="Decode sessions at workload.")
    headroom_gib: float | None = Field(
        default=None, alias="headroomGiB", description="Decode KV GiB per rank beyond the workload."
    )


class RoleStatus(ApiModel):
    """Observed state of one role."""

    revision: str | None = Field(default=None, description="Revision hash its pods run.")
    replicas: int = Field(default=0, description="Desired replicas.")
    ready: int = Field(default=0, description="Ready replicas.")


class RolesStatus(ApiModel):
    """Observed state of both roles."""

    prefill: RoleStatus = Field(default_factory=RoleStatus, description="Prefill.")
    decode: RoleStatus = Field(default_factory=RoleStatus, description="Decode.")


class GuardStatus(ApiModel):
    """What the guard saw last."""

    revision: str | None = Field(default=None, description="Revision the window belongs to.")
    since: Timestamp | None = Field(default=None, description="When that revision went live.")
    leak_rate: float | None = Field(default=None, description="Observed leak rate.")
    samples: int = Field(default=0, description="Canary responses in the current window.")
    leaks: int = Field(default=0, description="Leaked responses in the current window.")
    traffic_samples: int = Field(
        default=0, description="Production tool-calling responses the leak taps classified."
    )
    traffic_leaks: int = Field(default=0, description="Of those, leaked ones.")
    engine_samples: int = Field(
        default=0,
        description="Tool-calling responses the revision's decode engines parsed "
        "(sglang:dsv4_tool_call_responses_total).",
    )
    engine_leaks: int = Field(
        default=0, description="Of those, responses in which the parser dropped a call."
    )
    kv_requests: int = Field(
        default=0, description="Requests the revision's decode engines finished."
    )
    kv_failures: int = Field(
        default=0,
        description="KV transfers the revision's engines counted failed (both roles; "
        "checksum mismatches included).",
    )
    last_verdict: Verdict | None = Field(default=None, description="Pass, Fail, NoData or Error.")
    last_reason: VerdictReason | None = Field(
        default=None, description="Reason of the last verdict."
    )
    last_message: str | None = Field(default=None, description="Evidence of the last verdict.")
    last_sample_time: Timestamp | None = Field(default=None, description="RFC 3339 time.")
    oom_events: int = Field(default=0, description="OOM events in the window.")
    canary_sessions: int | None = Field(
        default=None,
        description="Concurrent sessions each canary run opens (spec.guard.canary.sessions, or "
        "the decode engine's DP ranks x sessionsPerRank capped by the plan); unset while the "
        "canary is off.",
    )
    consecutive_errors: int = Field(default=0, description="Source errors in a row.")
    passing_since: Timestamp | None = Field(
        default=None, description="Start of the current run of Pass verdicts (baking)."
    )
    bisect: BisectState | None = Field(
        default=None,
        description="The running culprit search (spec.guard.bisect), kept so it resumes.",
    )
    culprit: CulpritStatus | None = Field(
        default=None,
        description="What the last culprit search found: the settings, or why none.",
    )


# status.guard's fields that move with every canary run or tap read while nothing a user acts
# on changes: counts of answers that are not leaks, the time of the last sample, the leak
# rate and evidence text that restate them, a failing source's errors in a row (a blind
# guard's GuardBlind names the causes; dsv4_guard_source_errors has the count). They are
# written with the next change a user would see (a verdict, a reason, a leak, a bake, a
# phase, a condition) and exported live as metrics (dsv4_guard_window_samples,
# dsv4_canary_last_run_timestamp_seconds); on their own they never cause a status write, so
# an idle guard, or a blind one, writes nothing (docs/guard.md).
LIVE_GUARD_FIELDS = frozenset(
    {
        "samples",
        "leak_rate",
        "traffic_samples",
        "engine_samples",
        "kv_requests",
        "last_sample_time",
        "last_message",
        "consecutive_errors",
    }
)


# status.guard's fields the culprit search writes (signals/bisector.py), not the reconcile pass.
BISECT_FIELDS = ("bisect", "culprit")


class QuarantineEntry(ApiModel):
    """A configuration that was rolled back and is not rolled out again."""

    hash: str = Field(description="Config hash.")
    revision: str | None = Field(default=None, description="ControllerRevision name.")
    reason: QuarantineReason = Field(description="LeakRate, OOM, NoData or KVIntegrity.")
    message: str = Field(default="", description="Evidence.")
    at: Timestamp = Field(description="RFC 3339 time.")


class PodTermination(ApiModel):
    """How one pod of a restarted group last ended (or that it was still running)."""

    pod: str = Field(description="Pod name.")
    worker_index: int = Field(description="Its index in the group: 0 is the leader.")
    reason: str | None = Field(default=None, description="Termination reason (OOMKilled, Error).")
    exit_code: int | None = Field(default=None, description="The container's exit code.")
    message: str = Field(
        default="",
        description="The termination message (the log tail the kubelet kept; truncated); empty "
        "for a pod that was still running.",
    )


class GroupRestart(ApiModel):
    """A multi-node group restarted because one pod failed: what every pod of it said last,
    kept before the restart replaced them (LeaderWorkerSet RecreateGroupOnPodRestart)."""

    group: str = Field(description="The group's leader pod: `<LeaderWorkerSet>-<group index>`.")
    role: str = Field(description="prefill or decode.")
    revision: str | None = Field(default=None, description="Revision the group ran.")
    cause: str = Field(description="The pod that failed, and how.")
    at: Timestamp = Field(description="RFC 3339 time the operator saw it.")
    key: str = Field(description="The failed pod's uid and restart count (one entry each).")
    pods: list[PodTermination] = Field(
        default_factory=list, description="Every pod of the group, leader first."
    )


class DSV4DeploymentStatus(ApiModel):
    """Observed state, rebuilt each pass (except lastKnownGoodRevision and quarantine)."""

    phase: Phase = Field(default="Pending", description="Summary phase.")
    observed_generation: int | None = Field(default=None, description="Last generation acted on.")
    current_revision: str | None = Field(default=None, description="Revision being served.")
    last_known_good_revision: str | None = Field(
        default=None, description="Revision that baked with Pass and no OOM."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "Validated, Ready, Progressing, Degraded, RolledBack, GuardBlind, MonitoringReady, "
            "WeightsReady, PlanVerified, LeakShapesVisible, Bisected."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    findings: list[Finding] = Field(default_factory=list, description="Rule findings on the spec.")
    plan: PlanStatus | None = Field(default=None, description="Memory plan.")
    roles: RolesStatus | None = Field(default=None, description="Per-role state.")
    guard: GuardStatus | None = Field(default=None, description="Guard state.")
    quarantine: list[QuarantineEntry] = Field(
        default_factory=list, description="Quarantined configs."
    )
    group_restarts: list[GroupRestart] = Field(
        default_factory=list,
        description="The last restarts of multi-node groups, oldest first, with the last "
        "termination of every pod of each.",
    )

    def reconciled_wire(self) -> dict[str, object]:
        """What the reconcile pass applies: all but status.guard's culprit search
        (BISECT_FIELDS), which the search applies under its own field manager, so a pass that
        read an older status never writes an older search back."""
        wire = self.to_wire()
        guard = wire.get("guard")
        if isinstance(guard, dict):
            wire["guard"] = {k: v for k, v in guard.items() if k not in BISECT_FIELDS}
        return wire

    def visible_wire(self) -> dict[str, object]:
        """The stored form without status.guard's live fields (LIVE_GUARD_FIELDS): a status
        is written only when this differs from what is stored."""
        wire = self.to_wire()
        guard = wire.get("guard")
        if isinstance(guard, dict):
            live = {GuardStatus.model_fields[f].alias or f for f in LIVE_GUARD_FIELDS}
            wire["guard"] = {k: v for k, v in guard.items() if k not in live}
        return wire


def parse_status(raw: Mapping[str, Any] | None) -> DSV4DeploymentStatus:
    """A stored status as the model; one that does not parse is rebuilt from nothing.

    Only the operator writes status, through this model and the CRD's schema, so a status
    that does not parse means a hand edit.
    """
    try:
        return DSV4DeploymentStatus.model_validate(raw or {})
    except ValidationError as error:
        log.warning("ignoring a status that does not parse: %s", error)
        return DSV4DeploymentStatus()

"""How many concurrent sessions the guard's canary runs: the engine's data-parallel ranks x a
per-rank count, capped by the memory plan and the API's bounds, unless the spec says.

DeepSeek-V4 with DP attention corrupted its output only at 8-9 concurrent requests per DP rank
(sglang #33397: 2x H200, clean at lower load), so a canary that is to see such a corruption has
to load every rank that far. docs/guard.md ("The canary") explains the default.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4_operator.api.limits import MAX_CANARY_SESSIONS
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import effective_role
from dsv4_operator.engine.planner import MemoryPlan, PlanningError, plan


@dataclass(frozen=True)
class CanaryLoad:
    """The canary's concurrency and where it comes from."""

    sessions: int
    dp_ranks: int
    explicit: bool  # spec.guard.canary.sessions was set


def decode_dp_ranks(spec: DSV4DeploymentSpec) -> int:
    """The decode engine's data-parallel ranks: `--dp-size` (any spelling the release's parser
    accepts) with or without DP attention, 1 when unset. Decode answers the canary."""
    return max(1, effective_role(spec, "decode").int_flag("--dp-size"))


def canary_load(spec: DSV4DeploymentSpec, memory_plan: MemoryPlan | None = None) -> CanaryLoad:
    """The sessions the canary runs: spec.guard.canary.sessions when set; otherwise DP ranks x
    sessionsPerRank, at most the plan's decode sessions capacity (when the spec plans) and the
    CRD's bound, and at least 1."""
    canary = spec.guard.canary
    ranks = decode_dp_ranks(spec)
    if canary.sessions is not None:
        return CanaryLoad(canary.sessions, ranks, explicit=True)
    wanted = ranks * canary.sessions_per_rank
    if memory_plan is None:
        try:
            memory_plan = plan(spec)
        except PlanningError:
            memory_plan = None
    if memory_plan is not None:
        wanted = min(wanted, memory_plan.roles["decode"].sessions_capacity)
    return CanaryLoad(max(1, min(wanted, MAX_CANARY_SESSIONS)), ranks, explicit=False)

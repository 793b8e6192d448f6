"""Status rebuilt from the world each pass; only lastKnownGood, quarantine and guard carry over."""

from __future__ import annotations

from dataclasses import dataclass

from dsv4_operator.api.engine import Capability
from dsv4_operator.api.roles import ROLES
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import (
    Condition,
    ConditionType,
    DSV4DeploymentStatus,
    GuardStatus,
    PlanStatus,
    RoleNumbers,
    RolesStatus,
    RoleStatus,
)
from dsv4_operator.api.times import Timestamp
from dsv4_operator.engine.canary_load import canary_load
from dsv4_operator.engine.planner import GIB
from dsv4_operator.engine.validation import Validation
from dsv4_operator.guard.decision import GuardDecision
from dsv4_operator.guard.plan import PlanCheck
from dsv4_operator.kube.objects import StatefulSetView
from dsv4_operator.names import LWS_KIND, ROUTER
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import ConditionReason
from dsv4_operator.reconcile.bisecting import bisected_condition
from dsv4_operator.reconcile.health import Fault, Health, find_fault, no_fault_message, phase
from dsv4_operator.reconcile.pod_causes import first_fault, first_problem
from dsv4_operator.reconcile.weights import WeightsState
from dsv4_operator.reconcile.world import World
from dsv4_operator.render.context import RenderContext


@dataclass(frozen=True)
class Progress:
    """Where the rollout stands after this pass."""

    reason: ConditionReason
    message: str
    complete: bool = False

    @classmethod
    def done(cls) -> Progress:
        return cls(ConditionReason.ROLLOUT_COMPLETE, "every role runs the desired revision", True)


def _condition(
    world: World,
    type_: ConditionType,
    ok: bool,
    reason: str,
    message: str,
    per_reason: bool = False,
) -> Condition:
    """The condition, its lastTransitionTime kept while its status (and, `per_reason`, its
    reason: Progressing's, whose time is when the current step began) stays the same."""
    status = "True" if ok else "False"
    previous = next((c for c in world.status.conditions if c.type == type_), None)
    since = (
        previous.last_transition_time
        if previous is not None
        and previous.status == status
        and (not per_reason or previous.reason == reason)
        else None
    )
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since or Timestamp.of(world.now),
        observed_generation=world.generation,
    )


def _pods(world: World, component: str, pair: str | None) -> list[PodView]:
    """The pods of one role of `pair` (the router's when `pair` is None)."""
    return [
        pod for pod in world.pods if pod.role == component and (pair is None or pod.pair == pair)
    ]


def _unit(workload: StatefulSetView | None) -> str:
    """ " groups" for a multi-node role (a LeaderWorkerSet's replicas are groups of pods)."""
    return " groups" if workload is not None and workload.kind == LWS_KIND else ""


def _because(what: str, problem: str | None) -> str:
    return f"{what} ({problem})" if problem else what


@dataclass(frozen=True)
class Observed:
    """The roles and the router as this pass saw them."""

    roles: RolesStatus
    missing: list[str]  # what is not ready, with the first pod problem of each
    fault: tuple[str, str] | None  # the first pod held by a fault (pod_causes.first_fault)

    @property
    def ready(self) -> bool:
        return not self.missing


def _observed(world: World) -> Observed:
    """Per-role observed state of the active pair, what is not ready and any pod fault."""
    pairs = world.pairs()
    active = pairs.get(world.active_pair_id() or "")
    roles: dict[str, RoleStatus] = {}
    missing: list[str] = []
    stuck: list[PodView] = []
    for role in ROLES:
        sts = active.statefulsets.get(role) if active else None
        want = (sts.replicas or 0) if sts else 0
        ready = sts.ready if sts else 0
        roles[role] = RoleStatus(
            revision=sts.revision if sts else None,
            replicas=want,
            ready=ready,
        )
        if sts is None or ready < want or want == 0:
            pods = _pods(world, role, active.id if active else None)
            stuck += pods
            missing.append(
                _because(
                    f"{role} {ready}/{want}{_unit(sts)} ready",
                    first_problem(pods, world.pod_events),
                )
            )
    router = world.router()
    router_want = (router.replicas or 0) if router else 0
    router_ready = router.available if router else 0
    if router is None or router_ready < router_want:
        pods = _pods(world, ROUTER, None)
        stuck += pods
        problem = first_problem(pods, world.pod_events)
        missing.append(_because(f"router {router_ready}/{router_want} available", problem))
    return Observed(
        RolesStatus(prefill=roles["prefill"], decode=roles["decode"]), missing, first_fault(stuck)
    )


def _plan(ctx: RenderContext) -> PlanStatus:
    plans = ctx.plan.roles
    decode = plans["decode"]
    return PlanStatus(
        sglang_version=ctx.plan.sglang_version,
        bytes_per_token={
            role: {
                **{k: round(v, 2) for k, v in p.sizing.per_token.items()},
                "total": round(p.bytes_per_full_token, 2),
            }
            for role, p in plans.items()
        },
        max_total_tokens=RoleNumbers(
            prefill=plans["prefill"].max_total_tokens, decode=decode.max_total_tokens
        ),
        sessions_capacity=decode.sessions_capacity,
        headroom_gib=round((decode.kv_pool_bytes - decode.workload_bytes) / GIB, 3),
    )


MONITORING_CRD_MISSING = (
    "spec.monitoring.serviceMonitor.enabled is true, but the API server does not serve "
    "monitoring.coreos.com/v1 ServiceMonitor: install the prometheus-operator CRDs (looked for "
    "again within 5 minutes) or set spec.monitoring.serviceMonitor.enabled: false; the rest of "
    "the deployment is reconciled as usual"
)


def monitoring_condition(world: World, spec: DSV4DeploymentSpec) -> Condition:
    """MonitoringReady: the ServiceMonitor is applied, not asked for, or cannot be."""
    if not spec.monitoring.service_monitor.enabled:
        return _condition(
            world, "MonitoringReady", True, ConditionReason.DISABLED, "no ServiceMonitor asked for"
        )
    if not world.monitoring_served:
        return _condition(
            world, "MonitoringReady", False, ConditionReason.CRD_MISSING, MONITORING_CRD_MISSING
        )
    return _condition(
        world, "MonitoringReady", True, ConditionReason.APPLIED, "ServiceMonitor applied"
    )


def _ready_condition(world: World, missing: list[str], weights: WeightsState | None) -> Condition:
    """Ready: every role and the router are; else what is not (the weights, while they load)."""
    if not missing:
        return _condition(
            world,
            "Ready",
            True,
            ConditionReason.ALL_REPLICAS_READY,
            "all roles and the router are ready",
        )
    if weights is not None and not weights.ready:
        return _condition(world, "Ready", False, ConditionReason.WEIGHTS_NOT_READY, weights.message)
    return _condition(world, "Ready", False, ConditionReason.REPLICAS_NOT_READY, "; ".join(missing))


def _degraded_condition(world: World, fault: Fault | None, otherwise: str) -> Condition:
    """Degraded: True for a fault only (health.find_fault); `otherwise` says what goes on."""
    if fault is not None:
        return _condition(world, "Degraded", True, fault.reason, fault.message)
    return _condition(world, "Degraded", False, ConditionReason.AS_EXPECTED, otherwise)


def _guard_conditions(world: World, guard: GuardDecision) -> list[Condition]:
    """RolledBack and GuardBlind, from what the guard decided this pass."""
    back = guard.rolled_back
    rolled_back = _condition(
        world,
        "RolledBack",
        back is not None,
        back.reason if back else ConditionReason.NOT_ROLLED_BACK,
        f"serving last known good {guard.last_known_good}; revision {back.hash} is "
        f"quarantined: {back.message}"
        if back
        else "not rolled back: the spec's revision is the one served",
    )
    blind = _condition(
        world,
        "GuardBlind",
        guard.blind,
        ConditionReason.SOURCE_ERRORS if guard.blind else ConditionReason.SEEING,
        # The causes, not their counts: a blind guard's status changes when a cause does,
        # not every round (the count is dsv4_guard_source_errors).
        f"{guard.blind_cause or 'the guard sources fail'} (errorLimit or more errors in a row)"
        if guard.blind
        else "the guard's sources answer (or none is due yet)",
    )
    return [rolled_back, blind]


def leak_shapes_condition(world: World, ctx: RenderContext) -> Condition:
    """LeakShapesVisible: whether the served image counts the tool calls its parser drops."""
    engine = ctx.spec.engine
    if Capability.TOOL_CALL_DROP_COUNTER in engine.capabilities:
        return _condition(
            world,
            "LeakShapesVisible",
            True,
            ConditionReason.ENGINE_COUNTS,
            "the engine image counts the tool calls its parser drops (toolCallDropCounter): "
            "the guard sees silent drops on tool_choice: auto traffic",
        )
    return _condition(
        world,
        "LeakShapesVisible",
        False,
        ConditionReason.NO_DROP_COUNTER,
        f"the engine image (SGLang {engine.sglang_version}) does not declare "
        "toolCallDropCounter: the guard cannot see silent drops on tool_choice: auto traffic "
        "(a tool call the parser drops reaches the client as prose, HTTP 200 and no "
        "tool_calls, which the leak tap counts as an answer); the canary, which knows a call "
        "is due, remains the signal",
    )


def plan_condition(world: World, plan: PlanCheck) -> Condition:
    """PlanVerified: what the revision's engine pods report against its plan and render."""
    return _condition(world, "PlanVerified", plan.verified, plan.reason, plan.message)


def _running_revision(world: World, roles: RolesStatus) -> str | None:
    """The revision both roles run, else the one recorded before (mid-rollout, or none yet)."""
    revisions = {roles.prefill.revision, roles.decode.revision}
    if len(revisions) == 1 and None not in revisions:
        return next(iter(revisions))
    return world.status.current_revision


def invalid_spec_status(world: World, validation: Validation, message: str) -> DSV4DeploymentStatus:
    """The status while the spec is invalid: nothing rolls out; the plan and the guard's memory
    carry over from the previous status."""
    previous = world.status
    seen = _observed(world)
    roles, missing = seen.roles, seen.missing
    has_rule = any(f.rule.startswith("DSV4-") for f in validation.errors)
    return DSV4DeploymentStatus(
        phase="Invalid",
        observed_generation=world.generation,
        current_revision=_running_revision(world, roles),
        conditions=[
            _condition(
                world,
                "Validated",
                False,
                ConditionReason.RULE_VIOLATION if has_rule else ConditionReason.SCHEMA_INVALID,
                message,
            ),
            _condition(
                world,
                "Progressing",
                False,
                ConditionReason.SPEC_INVALID,
                "no rollout while the spec is invalid",
            ),
            _ready_condition(world, missing, None),
            _degraded_condition(
                world, None, "no fault: nothing rolls out while the spec is invalid"
            ),
        ],
        findings=list(validation.findings),
        plan=previous.plan,
        roles=roles,
        last_known_good_revision=previous.last_known_good_revision,
        quarantine=list(previous.quarantine),
        guard=previous.guard,
    )


def rollout_status(
    world: World,
    validation: Validation,
    ctx: RenderContext,
    progress: Progress,
    guard: GuardDecision,
    weights: WeightsState | None,
    plan: PlanCheck | None = None,
) -> DSV4DeploymentStatus:
    """The status of a valid spec's rollout to `ctx`: progress, readiness, the guard's verdicts
    and memory, what it can see and whether the engines run their plan, monitoring and (when
    the operator fetches them) the weights."""
    seen = _observed(world)
    roles = seen.roles
    warnings = len(validation.findings) - len(validation.errors)
    progressing = _condition(
        world,
        "Progressing",
        not progress.complete,
        progress.reason,
        progress.message,
        per_reason=True,
    )
    health = Health(
        complete=progress.complete,
        progress_reason=progress.reason,
        progress_message=progress.message,
        step_since=(progressing.last_transition_time or Timestamp.of(world.now)).at,
        now=world.now,
        deadline_seconds=ctx.spec.progress_deadline_seconds,
        unavailable=tuple(seen.missing),
        pod_fault=seen.fault,
        weights_reason=weights.reason if weights else None,
        weights_message=weights.message if weights else "",
        no_known_good=guard.no_known_good,
    )
    fault = find_fault(health)
    conditions = [
        _condition(
            world,
            "Validated",
            True,
            ConditionReason.VALID,
            f"no error findings ({warnings} warnings)",
        ),
        progressing,
        _ready_condition(world, seen.missing, weights),
        _degraded_condition(world, fault, no_fault_message(health)),
        *_guard_conditions(world, guard),
        leak_shapes_condition(world, ctx),
        monitoring_condition(world, ctx.spec),
    ]
    if plan is not None:
        conditions.append(plan_condition(world, plan))
    bisected = bisected_condition(world.status)
    if bisected is not None:
        conditions.append(_condition(world, "Bisected", *bisected))
    if weights is not None:
        conditions.append(
            _condition(world, "WeightsReady", weights.ready, weights.reason, weights.message)
        )
    return DSV4DeploymentStatus(
        phase=phase(progress.complete, fault, guard.rolled_back is not None),
        observed_generation=world.generation,
        current_revision=ctx.revision if progress.complete else _running_revision(world, roles),
        conditions=conditions,
        findings=list(validation.findings),
        plan=_plan(ctx),
        roles=roles,
        # The guard's durable memory, as it decided it this pass.
        last_known_good_revision=guard.last_known_good,
        quarantine=list(guard.quarantine),
        guard=_with_canary_load(guard.guard, ctx),
    )


def _with_canary_load(guard: GuardStatus | None, ctx: RenderContext) -> GuardStatus | None:
    """The guard's status with the canary's concurrency, the one the canary runner uses."""
    if guard is None or not ctx.spec.guard.canary.enabled:
        return guard
    load = canary_load(ctx.spec, ctx.plan)
    return guard.model_copy(update={"canary_sessions": load.sessions})


def with_rejection(
    world: World, status: DSV4DeploymentStatus, message: str
) -> DSV4DeploymentStatus:
    """`status` after the API server refused a child this pass wrote: `Progressing=False`,
    reason `ChildRejected`, with the server's message (it names the child and the field)."""
    rejected = _condition(world, "Progressing", False, ConditionReason.CHILD_REJECTED, message)
    conditions = [rejected if c.type == "Progressing" else c for c in status.conditions]
    return status.model_copy(update={"conditions": conditions})

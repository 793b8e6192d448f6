"""Status rebuilt from the world each pass; only lastKnownGood, quarantine and guard carry over."""

from __future__ import annotations

from dataclasses import dataclass

from dsv4_operator.api.roles import ROLES
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import (
    Condition,
    ConditionType,
    DSV4DeploymentStatus,
    Phase,
    PlanStatus,
    RoleNumbers,
    RolesStatus,
    RoleStatus,
)
from dsv4_operator.engine.planner import GIB
from dsv4_operator.engine.validation import Validation
from dsv4_operator.guard.decision import GuardOutcome
from dsv4_operator.names import (
    PAIR_LABEL,
    REVISION_LABEL,
    ROLE_LABEL,
    ROUTER,
    format_time,
    router_name,
)
from dsv4_operator.reconcile.pod_causes import first_problem
from dsv4_operator.reconcile.weights import WeightsState
from dsv4_operator.reconcile.world import Obj, World, labels_of
from dsv4_operator.render.context import RenderContext


@dataclass(frozen=True)
class Progress:
    """Where the rollout stands after this pass."""

    reason: str
    message: str
    complete: bool = False

    @classmethod
    def done(cls) -> Progress:
        return cls("RolloutComplete", "every role runs the desired revision", True)


def _condition(
    world: World, type_: ConditionType, ok: bool, reason: str, message: str
) -> Condition:
    status = "True" if ok else "False"
    previous = next((c for c in world.status.conditions if c.type == type_), None)
    since = (
        previous.last_transition_time
        if previous is not None and previous.status == status
        else None
    )
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since or format_time(world.now),
        observed_generation=world.generation,
    )


def _pods(world: World, component: str, pair: str | None) -> list[Obj]:
    """The pods of one role of `pair` (the router's when `pair` is None)."""
    return [
        pod
        for pod in world.pods
        if labels_of(pod).get(ROLE_LABEL) == component
        and (pair is None or labels_of(pod).get(PAIR_LABEL) == pair)
    ]


def _because(what: str, problem: str | None) -> str:
    return f"{what} ({problem})" if problem else what


def _roles(world: World) -> tuple[RolesStatus, bool, list[str]]:
    """Per-role observed state of the active pair, whether all is ready, and what is not."""
    pairs = world.pairs()
    active = pairs.get(world.active_pair_id() or "")
    roles: dict[str, RoleStatus] = {}
    missing: list[str] = []
    for role in ROLES:
        sts = active.statefulsets.get(role) if active else None
        want = int(sts["spec"].get("replicas", 0)) if sts else 0
        ready = int((sts or {}).get("status", {}).get("readyReplicas", 0))
        roles[role] = RoleStatus(
            revision=labels_of(sts).get(REVISION_LABEL) if sts else None,
            replicas=want,
            ready=ready,
        )
        if sts is None or ready < want or want == 0:
            pods = _pods(world, role, active.id if active else None)
            missing.append(
                _because(f"{role} {ready}/{want} ready", first_problem(pods, world.pod_events))
            )
    router = world.live("Deployment", router_name(world.name))
    router_want = int(router["spec"].get("replicas", 0)) if router else 0
    router_ready = int((router or {}).get("status", {}).get("availableReplicas", 0))
    if router is None or router_ready < router_want:
        problem = first_problem(_pods(world, ROUTER, None), world.pod_events)
        missing.append(_because(f"router {router_ready}/{router_want} available", problem))
    return RolesStatus(prefill=roles["prefill"], decode=roles["decode"]), not missing, missing


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
    "monitoring.coreos.com/v1 ServiceMonitor: install the prometheus-operator CRDs (checked "
    "again every 5 minutes) or set spec.monitoring.serviceMonitor.enabled: false; the rest of "
    "the deployment is reconciled as usual"
)


def monitoring_condition(world: World, spec: DSV4DeploymentSpec) -> Condition:
    """MonitoringReady: the ServiceMonitor is applied, not asked for, or cannot be."""
    if not spec.monitoring.service_monitor.enabled:
        return _condition(world, "MonitoringReady", True, "Disabled", "no ServiceMonitor asked for")
    if not world.monitoring_served:
        return _condition(world, "MonitoringReady", False, "CRDMissing", MONITORING_CRD_MISSING)
    return _condition(world, "MonitoringReady", True, "Applied", "ServiceMonitor applied")


def build_status(
    world: World,
    validation: Validation,
    ctx: RenderContext | None,
    progress: Progress | None,
    invalid_message: str | None,
    view: GuardOutcome | None = None,
    weights: WeightsState | None = None,
) -> DSV4DeploymentStatus:
    """The whole status object."""
    previous = world.status
    roles, ready, missing = _roles(world)
    warnings = len(validation.findings) - len(validation.errors)
    conditions: list[Condition] = []
    phase: Phase
    if invalid_message is not None or ctx is None or progress is None:
        has_rule = any(f.rule.startswith("DSV4-") for f in validation.errors)
        conditions.append(
            _condition(
                world,
                "Validated",
                False,
                "RuleViolation" if has_rule else "SchemaInvalid",
                invalid_message or "invalid",
            )
        )
        conditions.append(
            _condition(
                world, "Progressing", False, "SpecInvalid", "no rollout while the spec is invalid"
            )
        )
        phase = "Invalid"
    else:
        conditions.append(
            _condition(
                world, "Validated", True, "Valid", f"no error findings ({warnings} warnings)"
            )
        )
        conditions.append(
            _condition(
                world, "Progressing", not progress.complete, progress.reason, progress.message
            )
        )
        phase = "Progressing" if not progress.complete else ("Ready" if ready else "Degraded")
    settled = invalid_message is None and progress is not None and progress.complete
    waiting_for_weights = weights is not None and not weights.ready and not ready
    conditions.append(
        _condition(
            world,
            "Ready",
            ready,
            "AllReplicasReady"
            if ready
            else ("WeightsNotReady" if waiting_for_weights else "ReplicasNotReady"),
            "all roles and the router are ready"
            if ready
            else "; ".join([weights.message] if weights and waiting_for_weights else missing),
        )
    )
    if view is not None and view.no_known_good:
        conditions.append(_condition(world, "Degraded", True, "NoKnownGood", view.no_known_good))
    else:
        conditions.append(
            _condition(
                world,
                "Degraded",
                settled and not ready,
                "ReplicasUnavailable" if settled and not ready else "AsExpected",
                "; ".join(missing) if settled and not ready else "",
            )
        )
    if view is not None:
        back = view.rolled_back
        conditions.append(
            _condition(
                world,
                "RolledBack",
                back is not None,
                back.reason if back else "NotRolledBack",
                f"serving last known good {view.last_known_good}; revision {back.hash} is "
                f"quarantined: {back.message}"
                if back
                else "",
            )
        )
        conditions.append(
            _condition(
                world,
                "GuardBlind",
                view.blind,
                "SourceErrors" if view.blind else "Seeing",
                (view.guard.last_message or "") if view.blind and view.guard else "",
            )
        )
        if phase == "Ready" and back is not None:
            phase = "RolledBack"
        if view.no_known_good and phase == "Ready":
            phase = "Degraded"
    if ctx is not None:
        conditions.append(monitoring_condition(world, ctx.spec))
    if weights is not None:
        conditions.append(
            _condition(world, "WeightsReady", weights.ready, weights.reason, weights.message)
        )
    revisions = {roles.prefill.revision, roles.decode.revision}
    current: str | None
    if settled and ctx is not None:
        current = ctx.revision
    elif len(revisions) == 1 and None not in revisions:
        current = next(iter(revisions))
    else:
        current = previous.current_revision
    return DSV4DeploymentStatus(
        phase=phase,
        observed_generation=world.generation,
        current_revision=current,
        conditions=conditions,
        findings=list(validation.findings),
        plan=_plan(ctx) if ctx is not None else previous.plan,
        roles=roles,
        # The guard's durable memory: what it decided now, else what it decided before.
        last_known_good_revision=(
            view.last_known_good if view is not None else previous.last_known_good_revision
        ),
        quarantine=list(view.quarantine if view is not None else previous.quarantine),
        guard=view.guard if view is not None else previous.guard,
    )


def with_rejection(
    world: World, status: DSV4DeploymentStatus, message: str
) -> DSV4DeploymentStatus:
    """`status` after the API server refused a child this pass wrote: `Progressing=False`,
    reason `ChildRejected`, with the server's message (it names the child and the field)."""
    rejected = _condition(world, "Progressing", False, "ChildRejected", message)
    conditions = [rejected if c.type == "Progressing" else c for c in status.conditions]
    return status.model_copy(update={"conditions": conditions})

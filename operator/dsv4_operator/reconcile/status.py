"""Status rebuilt from the world each pass; only lastKnownGood, quarantine and guard carry over."""

from __future__ import annotations

from dataclasses import dataclass

from dsv4_operator.api.spec import ROLES
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
from dsv4_operator.names import REVISION_LABEL, format_time, router_name
from dsv4_operator.reconcile.world import World, labels_of
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
            missing.append(f"{role} {ready}/{want} ready")
    router = world.live("Deployment", router_name(world.name))
    router_want = int(router["spec"].get("replicas", 0)) if router else 0
    router_ready = int((router or {}).get("status", {}).get("availableReplicas", 0))
    if router is None or router_ready < router_want:
        missing.append(f"router {router_ready}/{router_want} available")
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


def build_status(
    world: World,
    validation: Validation,
    ctx: RenderContext | None,
    progress: Progress | None,
    invalid_message: str | None,
    view: GuardOutcome | None = None,
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
    conditions.append(
        _condition(
            world,
            "Ready",
            ready,
            "AllReplicasReady" if ready else "ReplicasNotReady",
            "all roles and the router are ready" if ready else "; ".join(missing),
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

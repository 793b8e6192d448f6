"""Status rebuilt from the world each pass; only lastKnownGood, quarantine and guard carry over."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4_operator.api.spec import ROLES
from dsv4_operator.api.status import Condition, DSV4DeploymentStatus
from dsv4_operator.engine.planner import GIB
from dsv4_operator.engine.validation import Validation
from dsv4_operator.reconcile.world import World, labels_of
from dsv4_operator.render.context import REVISION_LABEL, RenderContext

# Decisions of the guard (a later component) that a status rebuild must not forget.
DURABLE_FIELDS = ("lastKnownGoodRevision", "quarantine", "guard")


@dataclass(frozen=True)
class GuardView:
    """The guard's durable memory after this pass, and what it means for conditions."""

    guard: dict[str, Any] | None
    last_known_good: str | None
    quarantine: list[dict[str, Any]]
    rolled_back: dict[str, Any] | None
    blind: bool
    no_known_good: str | None


@dataclass(frozen=True)
class Progress:
    """Where the rollout stands after this pass."""

    reason: str
    message: str
    complete: bool = False

    @classmethod
    def done(cls) -> Progress:
        return cls("RolloutComplete", "every role runs the desired revision", True)


def _condition(world: World, type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    status = "True" if ok else "False"
    previous: dict[str, Any] = next(
        (c for c in world.status_raw.get("conditions", []) if c.get("type") == type_), {}
    )
    since = previous.get("lastTransitionTime") if previous.get("status") == status else None
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since or world.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        observed_generation=world.generation,
    ).to_wire()


def _roles(world: World) -> tuple[dict[str, Any], bool, list[str]]:
    """Per-role observed state of the active pair, whether all is ready, and what is not."""
    pairs = world.pairs()
    active = pairs.get(world.active_pair_id() or "")
    roles: dict[str, Any] = {}
    missing: list[str] = []
    for role in ROLES:
        sts = active.statefulsets.get(role) if active else None
        want = int(sts["spec"].get("replicas", 0)) if sts else 0
        ready = int((sts or {}).get("status", {}).get("readyReplicas", 0))
        roles[role] = {
            "revision": labels_of(sts).get(REVISION_LABEL) if sts else None,
            "replicas": want,
            "ready": ready,
        }
        if sts is None or ready < want or want == 0:
            missing.append(f"{role} {ready}/{want} ready")
    router = world.live("Deployment", f"{world.name}-router")
    router_want = int(router["spec"].get("replicas", 0)) if router else 0
    router_ready = int((router or {}).get("status", {}).get("availableReplicas", 0))
    if router is None or router_ready < router_want:
        missing.append(f"router {router_ready}/{router_want} available")
    return (
        {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in roles.items()},
        (not missing),
        missing,
    )


def _plan(ctx: RenderContext) -> dict[str, Any]:
    plans = ctx.plan.roles
    decode = plans["decode"]
    return {
        "bytesPerToken": {
            role: {k: round(v, 2) for k, v in p.pool_bytes.items()} for role, p in plans.items()
        },
        "maxTotalTokens": {role: p.max_total_tokens for role, p in plans.items()},
        "sessionsCapacity": decode.sessions_capacity,
        "headroomGiB": round((decode.kv_pool_bytes - decode.workload_bytes) / GIB, 3),
    }


def build_status(
    world: World,
    validation: Validation,
    ctx: RenderContext | None,
    progress: Progress | None,
    invalid_message: str | None,
    view: GuardView | None = None,
) -> dict[str, Any]:
    """The whole status object, in wire form (validated by the status model)."""
    previous = world.status_raw
    roles, ready, missing = _roles(world)
    warnings = len(validation.findings) - len(validation.errors)
    conditions: list[dict[str, Any]] = []
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
                str(back["reason"]) if back else "NotRolledBack",
                f"serving last known good {view.last_known_good}; revision {back['hash']} is "
                f"quarantined: {back['message']}"
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
                str((view.guard or {}).get("lastMessage", "")) if view.blind else "",
            )
        )
        if phase == "Ready" and back is not None:
            phase = "RolledBack"
        if view.no_known_good and phase == "Ready":
            phase = "Degraded"
    revisions = {r.get("revision") for r in roles.values()}
    current: str | None
    if settled and ctx is not None:
        current = ctx.revision
    elif len(revisions) == 1 and None not in revisions:
        current = str(next(iter(revisions)))
    else:
        current = previous.get("currentRevision")
    status: dict[str, Any] = {
        "phase": phase,
        "observedGeneration": world.generation,
        "currentRevision": current,
        "conditions": conditions,
        "findings": [f.model_dump(mode="json") for f in validation.findings],
        "roles": roles,
    }
    if ctx is not None:
        status["plan"] = _plan(ctx)
    elif "plan" in previous:
        status["plan"] = previous["plan"]
    if view is not None:
        status["lastKnownGoodRevision"] = view.last_known_good
        status["quarantine"] = view.quarantine
        status["guard"] = view.guard
    else:
        for key in DURABLE_FIELDS:
            if key in previous:
                status[key] = previous[key]
    return DSV4DeploymentStatus.model_validate(
        {k: v for k, v in status.items() if v is not None}
    ).to_wire()

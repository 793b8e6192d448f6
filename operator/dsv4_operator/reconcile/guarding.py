"""The guard's part of a reconcile pass (pure): quarantine, verdict, rollback target, bake."""

from __future__ import annotations

from typing import Any

from dsv4_operator.api.spec import ROLES, DSV4DeploymentSpec
from dsv4_operator.guard.step import guard_step, stamp
from dsv4_operator.reconcile.plan import Plan
from dsv4_operator.reconcile.status import GuardView
from dsv4_operator.reconcile.world import World
from dsv4_operator.render.context import OwnerRef, RenderContext, build_context

CLEAR_QUARANTINE_ANNOTATION = "dsv4.io/clear-quarantine"


def _stored_context(world: World, revision: str | None, owner: OwnerRef) -> RenderContext | None:
    """The render context of a stored ControllerRevision (the rollback target)."""
    if not revision:
        return None
    stored = world.live("ControllerRevision", f"{world.name}-{revision}")
    if stored is None:
        return None
    spec = DSV4DeploymentSpec.model_validate(stored.get("data", {}).get("spec", {}))
    return build_context(world.name, world.namespace, spec, owner)


def _settled(world: World, revision: str) -> bool:
    active = world.pairs().get(world.active_pair_id() or "")
    return active is not None and all(
        active.revision(role) == revision and active.rolled(role) for role in ROLES
    )


def _was(world: World, type_: str, status: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == status
        for c in world.status_raw.get("conditions", [])
    )


def guard_pass(
    plan: Plan, spec: DSV4DeploymentSpec, user: RenderContext, owner: OwnerRef
) -> tuple[RenderContext | None, GuardView]:
    """Quarantine, guard verdict, rollback and bake: which context to roll out, and why."""
    world, previous = plan.world, plan.world.status_raw
    cleared = world.annotations.get(CLEAR_QUARANTINE_ANNOTATION)
    quarantine = [q for q in previous.get("quarantine", []) if q.get("hash") != cleared]
    previous_guard: dict[str, Any] = previous.get("guard") or {}
    snapshot = world.canary
    if len(quarantine) != len(previous.get("quarantine", [])):
        plan.note("Normal", "QuarantineCleared", f"revision {cleared} released from quarantine")
        plan.decision.cleared = True
        # Its old evidence must not quarantine it again at once: a fresh window.
        if previous_guard.get("revision") == cleared:
            previous_guard = {}
        if snapshot is not None and snapshot.revision == cleared:
            snapshot = None
    lkg = previous.get("lastKnownGoodRevision")
    lkg_ctx = _stored_context(world, lkg, owner)
    rolled_back = next((q for q in quarantine if q.get("hash") == user.revision), None)
    target: RenderContext | None = user
    no_known_good: str | None = None
    if rolled_back is not None:
        target = lkg_ctx
        if target is None:
            no_known_good = (
                f"revision {user.revision} is quarantined and no known-good revision exists"
            )
    guard_status: dict[str, Any] | None = previous.get("guard")
    blind = False
    if spec.guard.enabled and target is not None:
        result = guard_step(
            spec.guard,
            previous_guard,
            snapshot,
            world.pods,
            target.revision,
            baked=lkg == target.revision,
            settled=_settled(world, target.revision),
            now=world.now,
        )
        guard_status, blind = result.status, result.blind
        plan.decision.ooms = result.ooms
        if result.rollback and rolled_back is None:
            entry = {
                "hash": target.revision,
                "revision": f"{world.name}-{target.revision}",
                "reason": result.rollback,
                "message": result.verdict.message,
                "at": stamp(world.now),
            }
            if lkg_ctx is not None and lkg != target.revision:
                quarantine.append(entry)
                rolled_back = entry
                plan.decision.rollbacks.append(result.rollback)
                plan.note(
                    "Warning",
                    "RolledBack",
                    f"{result.rollback}: {result.verdict.message}; rolling back from "
                    f"{target.revision} to last known good {lkg}; {target.revision} is "
                    "quarantined until the spec changes",
                )
                target = lkg_ctx
            else:
                no_known_good = (
                    f"{result.verdict.message}; no known-good revision to roll "
                    "back to, keeping the current one"
                )
        elif result.promote and lkg != target.revision:
            lkg = target.revision
            plan.note(
                "Normal",
                "Baked",
                f"revision {lkg} passed bakeTime {spec.guard.bake_time} "
                "and is now the last known good revision",
            )
        if blind and not _was(world, "GuardBlind", "True"):
            plan.note(
                "Warning",
                "GuardBlind",
                f"{result.verdict.message} "
                f"({result.status['consecutiveErrors']} source errors in a row)",
            )
    if no_known_good and not _was(world, "Degraded", "True"):
        plan.note("Warning", "NoKnownGood", no_known_good)
    view = GuardView(guard_status, lkg, quarantine, rolled_back, blind, no_known_good)
    return target, view

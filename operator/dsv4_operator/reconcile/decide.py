"""decide(): the pure heart of reconcile. World in, Decision out; no I/O, no clock of its own.

Rollout semantics (DESIGN.md section 4): a change that keeps the P/D transfer-format key rolls
in place, decode first, then prefill. A change of the key never mixes formats: Recreate deletes
the router and the old pair and waits until their pods are gone before creating the new pair;
BlueGreen brings up a new pair under revision-suffixed names, switches the router once it is
ready, then deletes the old pair once the router has rolled. Every step is derived from the
world, so an operator restarted mid-rollout picks up where the world is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dsv4_operator.api.spec import ROLES, DSV4DeploymentSpec, Role
from dsv4_operator.engine.validation import Validation, validate_spec
from dsv4_operator.guard.oom import OomEvent
from dsv4_operator.guard.step import guard_step, stamp
from dsv4_operator.kube.resources import (
    CONTROLLER_REVISION,
    DEPLOYMENT,
    PDB,
    SERVICE,
    STATEFULSET,
    Resource,
)
from dsv4_operator.reconcile.diff import in_place, stamped
from dsv4_operator.reconcile.status import GuardView, Progress, build_status
from dsv4_operator.reconcile.world import Obj, Pair, World, deployment_rolled
from dsv4_operator.render.children import render_role, render_router, render_shared
from dsv4_operator.render.context import OwnerRef, RenderContext, build_context
from dsv4_operator.render.router import ROUTER
from dsv4_operator.revisions.store import controller_revision, next_number, to_prune

API_VERSION, KIND = "dsv4.io/v1alpha1", "DSV4Deployment"
WAIT_SECONDS = 5.0  # requeue while a rollout step waits on pods
CLEAR_QUARANTINE_ANNOTATION = "dsv4.io/clear-quarantine"


@dataclass(frozen=True)
class Note:
    """A Kubernetes Event to post about the owner."""

    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Decision:
    """What act() does: apply, delete, revisions, status, events; and when to look again."""

    apply: list[Obj] = field(default_factory=list)
    delete: list[tuple[Resource, str]] = field(default_factory=list)
    create: list[Obj] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Note] = field(default_factory=list)
    requeue_after: float | None = None
    ooms: list[OomEvent] = field(default_factory=list)
    rollbacks: list[str] = field(default_factory=list)
    cleared: bool = False  # a quarantine entry was released: the guard's window restarts

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.delete) + len(self.create)


@dataclass(frozen=True)
class Settings:
    """Knobs decide() needs from the operator settings."""

    revision_history_limit: int = 10


class _Plan:
    """Accumulates the actions of one pass, skipping objects already in place."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.decision = Decision()

    def ensure(self, objs: list[Obj]) -> bool:
        """Queue objects that differ from the world; True when all were already in place."""
        done = True
        for obj in objs:
            desired = stamped(obj)
            if not in_place(desired, self.world.live(obj["kind"], obj["metadata"]["name"])):
                self.decision.apply.append(desired)
                done = False
        return done

    def remove(self, res: Resource, name: str) -> None:
        if self.world.live(res.kind, name) is not None:
            self.decision.delete.append((res, name))

    def note(self, type_: str, reason: str, message: str) -> None:
        self.decision.events.append(Note(type_, reason, message))

    def wait(self) -> None:
        self.decision.requeue_after = WAIT_SECONDS


def _remove_pair(plan: _Plan, ctx: RenderContext, pair: str) -> None:
    old = _with_pair(ctx, pair)
    for role in ROLES:
        name = old.role_name(role)
        plan.remove(STATEFULSET, name)
        plan.remove(SERVICE, name)
        plan.remove(PDB, name)


def _with_pair(ctx: RenderContext, pair: str) -> RenderContext:
    return dataclasses.replace(ctx, pair=pair)


def _roll_in_place(
    plan: _Plan, ctx: RenderContext, active: Pair, pairs: dict[str, Pair]
) -> Progress:
    """Same transfer format: decode first, then prefill; the router stays on this pair."""
    ctx = _with_pair(ctx, active.id)
    plan.ensure(render_shared(ctx))
    router_done = plan.ensure(render_router(ctx))
    for role in reversed(ROLES):  # decode, then prefill
        objs = render_role(ctx, role)
        if not plan.ensure(objs):
            if active.revision(role) != ctx.revision:
                plan.note(
                    "Normal",
                    "RollingUpdate",
                    f"rolling {role} to revision {ctx.revision} (same transfer format "
                    f"{ctx.transfer_format}; decode first)",
                )
            plan.wait()
            return Progress("RollingUpdate", f"{role} is being updated to {ctx.revision}")
        if not active.rolled(role):
            plan.wait()
            return Progress("RollingUpdate", f"waiting for {role} replicas to be updated and ready")
    stale = [pid for pid in pairs if pid != active.id]
    if stale:
        router = plan.world.live("Deployment", ctx.role_name(ROUTER))
        if not router_done or router is None or not deployment_rolled(router):
            plan.wait()
            return Progress("SwitchingRouter", "waiting for the router to roll before cleanup")
        for pid in stale:
            _remove_pair(plan, ctx, pid)
        plan.note("Normal", "OldPairDeleted", f"deleted prefill/decode pair(s) {', '.join(stale)}")
        plan.wait()
        return Progress("CleaningUp", f"deleting old pair(s) {', '.join(stale)}")
    return Progress.done()


def _recreate(plan: _Plan, ctx: RenderContext, active: Pair, old_format: str) -> Progress:
    """Incompatible change, Recreate: router and both old roles go first, together."""
    plan.remove(DEPLOYMENT, ctx.role_name(ROUTER))
    for role in ROLES:
        plan.remove(STATEFULSET, _with_pair(ctx, active.id).role_name(role))
    plan.note(
        "Normal",
        "Recreate",
        f"transfer format changes {old_format} -> {ctx.transfer_format}: stopping the "
        f"router and both roles of pair {active.id} before starting revision {ctx.revision}",
    )
    plan.wait()
    return Progress("Recreating", "stopping the old pair before starting the new format")


def _blue_green(plan: _Plan, ctx: RenderContext, active: Pair) -> Progress:
    """Incompatible change, BlueGreen: new pair, then the router, then (later) the old pair."""
    green = _with_pair(ctx, ctx.revision)
    objs = [o for role in reversed(ROLES) for o in render_role(green, role)]
    if not plan.ensure(objs):
        plan.note(
            "Normal",
            "BlueGreenStarted",
            f"starting pair {green.pair} (format {ctx.transfer_format}) next to pair "
            f"{active.id}; the router stays on {active.id} until it is ready",
        )
        plan.wait()
        return Progress("BlueGreen", f"creating pair {green.pair}")
    pairs = plan.world.pairs()
    new = pairs.get(green.pair)
    if new is None or not all(new.rolled(role) for role in ROLES):
        plan.wait()
        return Progress("BlueGreen", f"waiting for pair {green.pair} to be ready")
    plan.ensure(render_router(green))
    plan.note("Normal", "RouterSwitched", f"router now targets pair {green.pair}")
    plan.wait()
    return Progress("SwitchingRouter", f"router switching to pair {green.pair}")


def _rollout(plan: _Plan, ctx: RenderContext, spec: DSV4DeploymentSpec) -> Progress:
    world = plan.world
    pairs = world.pairs()
    active_id = world.active_pair_id()
    if active_id is None:
        # No pair: a router could only point at stale names; it goes first. Its pods too
        # must be gone, since a terminating router still holds DNS names the new pair reuses.
        plan.remove(DEPLOYMENT, ctx.role_name(ROUTER))
        leftovers = world.pods
        if leftovers:
            plan.wait()
            return Progress("Recreating", f"waiting for {len(leftovers)} old pod(s) to stop")
        fresh = not plan.ensure(
            [o for role in reversed(ROLES) for o in render_role(ctx, role)]
            + render_router(ctx)
            + render_shared(ctx)
        )
        if fresh:
            plan.note(
                "Normal",
                "Creating",
                f"creating revision {ctx.revision} (format {ctx.transfer_format})",
            )
            plan.wait()
            return Progress("Creating", f"creating revision {ctx.revision}")
        return Progress.done()
    active = pairs[active_id]
    formats = active.formats
    if formats == {ctx.transfer_format} and active.complete:
        return _roll_in_place(plan, ctx, active, pairs)
    old_format = ",".join(sorted(formats))
    if spec.rollout.strategy == "BlueGreen" and active.complete and len(formats) == 1:
        return _blue_green(plan, ctx, active)
    return _recreate(plan, ctx, active, old_format)


def _revisions(
    plan: _Plan, contexts: list[RenderContext], settings: Settings, keep: set[str]
) -> None:
    """Store each context's config once; prune the oldest beyond the history limit."""
    world = plan.world
    number = next_number(world.revisions)
    for ctx in {c.revision: c for c in contexts}.values():
        if world.live("ControllerRevision", f"{ctx.name}-{ctx.revision}") is None:
            plan.decision.create.append(controller_revision(ctx, number))
            number += 1
            plan.note("Normal", "RevisionCreated", f"stored engine config revision {ctx.revision}")
    keep = keep | {c.revision for c in contexts}
    for name in to_prune(world.revisions, settings.revision_history_limit, keep):
        plan.decision.delete.append((CONTROLLER_REVISION, name))


def _invalid(plan: _Plan, validation: Validation) -> None:
    previous = {c.get("type"): c for c in plan.world.status_raw.get("conditions", [])}
    message = _invalid_message(validation)
    was = previous.get("Validated", {})
    if was.get("status") != "False" or was.get("message") != message:
        plan.note("Warning", "Invalid", message)


def _invalid_message(validation: Validation) -> str:
    ids = validation.rule_ids("error")
    first = validation.errors[0]
    return (
        f"spec rejected by {', '.join(ids)}: {first.field}: {first.message}"
        + ("" if len(validation.errors) == 1 else f" (+{len(validation.errors) - 1} more)")
        + "; nothing was rolled out, running children keep their config"
    )


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


def _guard(
    plan: _Plan, spec: DSV4DeploymentSpec, user: RenderContext, owner: OwnerRef
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


def decide(world: World, settings: Settings | None = None) -> Decision:
    """One reconcile pass."""
    settings = settings or Settings()
    plan = _Plan(world)
    validation = validate_spec(world.spec_raw)
    if not validation.valid or validation.spec is None:
        _invalid(plan, validation)
        plan.decision.status = build_status(
            world, validation, None, None, _invalid_message(validation)
        )
        return plan.decision
    spec = validation.spec
    owner = OwnerRef(API_VERSION, KIND, world.name, world.uid)
    user = build_context(world.name, world.namespace, spec, owner)
    target, view = _guard(plan, spec, user, owner)
    if target is None:
        progress = Progress("Quarantined", view.no_known_good or "quarantined")
        target = user
    else:
        progress = _rollout(plan, target, target.spec)
    keep = {p.revision(r) or "" for p in world.pairs().values() for r in ROLES}
    keep |= {str(view.last_known_good or ""), user.revision}
    _revisions(plan, [target, user], settings, keep)
    plan.decision.status = build_status(world, validation, target, progress, None, view)
    return plan.decision


__all__ = ["Decision", "Note", "Role", "Settings", "decide"]

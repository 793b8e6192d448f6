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

from dsv4_operator.api.spec import ROLES, DSV4DeploymentSpec
from dsv4_operator.engine.validation import Validation, validate_spec
from dsv4_operator.kube.resources import (
    CONTROLLER_REVISION,
    DEPLOYMENT,
    PDB,
    SERVICE,
    SERVICE_MONITOR,
    STATEFULSET,
)
from dsv4_operator.reconcile.guarding import guard_pass
from dsv4_operator.reconcile.plan import Decision, Plan, Settings
from dsv4_operator.reconcile.status import Progress, build_status
from dsv4_operator.reconcile.world import Pair, World, deployment_rolled
from dsv4_operator.render.children import render_role, render_router, render_shared
from dsv4_operator.render.context import OwnerRef, RenderContext, build_context
from dsv4_operator.render.router import ROUTER
from dsv4_operator.revisions.store import controller_revision, next_number, to_prune

API_VERSION, KIND = "dsv4.io/v1alpha1", "DSV4Deployment"


def _remove_pair(plan: Plan, ctx: RenderContext, pair: str) -> None:
    old = _with_pair(ctx, pair)
    for role in ROLES:
        name = old.role_name(role)
        plan.remove(STATEFULSET, name)
        plan.remove(SERVICE, name)
        plan.remove(PDB, name)


def _with_pair(ctx: RenderContext, pair: str) -> RenderContext:
    return dataclasses.replace(ctx, pair=pair)


def _roll_in_place(
    plan: Plan, ctx: RenderContext, active: Pair, pairs: dict[str, Pair]
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


def _recreate(plan: Plan, ctx: RenderContext, active: Pair, old_format: str) -> Progress:
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


def _blue_green(plan: Plan, ctx: RenderContext, active: Pair) -> Progress:
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


def _rollout(plan: Plan, ctx: RenderContext, spec: DSV4DeploymentSpec) -> Progress:
    world = plan.world
    if not spec.monitoring.service_monitor.enabled:
        plan.remove(SERVICE_MONITOR, ctx.name)
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
    plan: Plan, contexts: list[RenderContext], settings: Settings, keep: set[str]
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


def _invalid(plan: Plan, validation: Validation) -> None:
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


def decide(world: World, settings: Settings | None = None) -> Decision:
    """One reconcile pass."""
    settings = settings or Settings()
    plan = Plan(world)
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
    target, view = guard_pass(plan, spec, user, owner)
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


__all__ = ["decide"]

"""decide(): the pure heart of reconcile. World in, Decision out; no I/O, no clock of its own.

Rollout semantics (docs/operator.md, "Rollouts never mix P/D transfer formats"): a change
that keeps the P/D transfer-format key rolls in place, decode first, then prefill. A change of
the key never mixes formats: Recreate deletes the router and the old pair and waits until their
pods are gone before creating the new pair; BlueGreen brings up a new pair under
revision-suffixed names, switches the router once it is ready, then deletes the old pair once
the router has rolled. Every step is derived from the world, so an operator restarted
mid-rollout picks up where the world is.
"""

from __future__ import annotations

import dataclasses

from dsv4_operator.api.roles import ROLES
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.engine.validation import Validation
from dsv4_operator.guard.decision import GuardDecision
from dsv4_operator.kube.objects import labels_of, name_of
from dsv4_operator.kube.resources import (
    CONTROLLER_REVISION,
    DEPLOYMENT,
    PDB,
    SERVICE,
    SERVICE_MONITOR,
    WORKLOADS,
    Resource,
)
from dsv4_operator.names import (
    API_VERSION,
    KIND,
    MAIN_PAIR,
    MODEL_KIND,
    PAIR_LABEL,
    ROLE_LABEL,
    revision_name,
    router_name,
)
from dsv4_operator.reasons import ConditionReason, EventReason, weights_event_reason
from dsv4_operator.reconcile.actions import Actions, Decision, ReconcileSettings
from dsv4_operator.reconcile.groups import groups_unavailable, with_group_restarts
from dsv4_operator.reconcile.guarding import guard_pass, plan_check
from dsv4_operator.reconcile.health import WEIGHTS_UNDER_WAY, Health, seconds_to_deadline
from dsv4_operator.reconcile.pod_causes import seconds_until_causes_due
from dsv4_operator.reconcile.status import Progress, invalid_spec_status, rollout_status
from dsv4_operator.reconcile.weights import WeightsState, deployment_weights, with_model_source
from dsv4_operator.reconcile.world import Pair, World
from dsv4_operator.render.children import (
    controller_revision,
    render_role,
    render_router,
    render_shared,
)
from dsv4_operator.render.context import Manifest, OwnerRef, RenderContext, build_context
from dsv4_operator.render.weights import inline_model
from dsv4_operator.revisions.store import next_number, to_prune


def _remove_pair(actions: Actions, ctx: RenderContext, pair: str) -> None:
    """Services and PDBs first, the StatefulSets (which make the pair known) last: an
    operator stopped half-way still sees the pair next time and finishes the job."""
    old = _with_pair(ctx, pair)
    names = [old.role_name(role) for role in ROLES]
    for name in names:
        actions.remove(SERVICE, name)
        actions.remove(PDB, name)
    for name in names:
        _remove_workload(actions, name)


def _remove_workload(actions: Actions, name: str) -> None:
    """Delete a role's workload, whichever kind it is (StatefulSet or LeaderWorkerSet)."""
    for res in WORKLOADS.values():
        actions.remove(res, name)


def _orphans(world: World, pairs: dict[str, Pair]) -> list[tuple[Resource, str]]:
    """Engine Services and PDBs of a pair that has no StatefulSet left (a cleanup cut short
    before the order above, or a StatefulSet deleted by hand)."""
    return [
        (res, name_of(obj))
        for res, pool in ((SERVICE, world.services), (PDB, world.pdbs))
        for obj in pool
        if labels_of(obj).get(ROLE_LABEL) in ROLES
        and labels_of(obj).get(PAIR_LABEL, MAIN_PAIR) not in pairs
    ]


def _shared(world: World, ctx: RenderContext) -> list[Manifest]:
    """The shared children (the ServiceMonitor), unless the API server cannot take them
    (no prometheus-operator CRDs: reported as MonitoringReady=False instead)."""
    return render_shared(ctx) if world.monitoring_served else []


def _with_pair(ctx: RenderContext, pair: str) -> RenderContext:
    return dataclasses.replace(ctx, pair=pair)


def _roll_in_place(
    actions: Actions, ctx: RenderContext, active: Pair, pairs: dict[str, Pair]
) -> Progress:
    """Same transfer format: decode first, then prefill; the router stays on this pair."""
    ctx = _with_pair(ctx, active.id)
    actions.ensure(_shared(actions.world, ctx))
    router_done = actions.ensure(render_router(ctx))
    for role in reversed(ROLES):  # decode, then prefill
        objs = render_role(ctx, role)
        missing = role not in active.statefulsets
        if not actions.ensure(objs):
            # Deleted by someone (the same format, so the other role stays); unless the pair
            # never ran: a first create the API server refused part of is not finished yet.
            if missing and actions.world.status.current_revision is not None:
                actions.note(
                    "Warning",
                    EventReason.CHILD_RECREATED,
                    f"{role} StatefulSet {ctx.role_name(role)} was missing; recreated it at "
                    f"revision {ctx.revision} (transfer format {ctx.transfer_format} "
                    "unchanged: the other role and the router are left running)",
                )
            elif active.revision(role) != ctx.revision:
                actions.note(
                    "Normal",
                    EventReason.ROLLING_UPDATE,
                    f"rolling {role} to revision {ctx.revision} (same transfer format "
                    f"{ctx.transfer_format}; decode first)",
                )
            actions.wait()
            return Progress(
                ConditionReason.ROLLING_UPDATE, f"{role} is being updated to {ctx.revision}"
            )
        if not active.rolled(role):
            actions.wait()
            return Progress(
                ConditionReason.ROLLING_UPDATE,
                f"waiting for {role} replicas to be updated and ready",
            )
    stale = [pid for pid in pairs if pid != active.id]
    if stale:
        router = actions.world.router()
        if not router_done or router is None or not router.rolled:
            actions.wait()
            return Progress(
                ConditionReason.SWITCHING_ROUTER, "waiting for the router to roll before cleanup"
            )
        for pid in stale:
            _remove_pair(actions, ctx, pid)
        actions.note(
            "Normal",
            EventReason.OLD_PAIR_DELETED,
            f"deleted prefill/decode pair(s) {', '.join(stale)}",
        )
        actions.wait()
        return Progress(ConditionReason.CLEANING_UP, f"deleting old pair(s) {', '.join(stale)}")
    router = actions.world.router()
    if router is None or not router.rolled:
        # After a Recreate (or an edit of the router) its pods come up last: the rollout is
        # not complete until they are available, so a planned rollout is never Degraded.
        actions.wait()
        return Progress(
            ConditionReason.ROLLING_UPDATE, "waiting for the router's pods to be available"
        )
    orphans = _orphans(actions.world, pairs)
    if orphans:
        for res, name in orphans:
            actions.remove(res, name)
        listed = ", ".join(f"{res.kind} {name}" for res, name in orphans)
        actions.note(
            "Normal", EventReason.ORPHANS_DELETED, f"deleted {listed} of pairs no longer running"
        )
        return Progress(ConditionReason.CLEANING_UP, f"deleting {listed}")
    return Progress.done()


def _recreate(actions: Actions, ctx: RenderContext, active: Pair, old_format: str) -> Progress:
    """Incompatible change, Recreate: router and both old roles go first, together."""
    actions.remove(DEPLOYMENT, router_name(ctx.name))
    for role in ROLES:
        _remove_workload(actions, _with_pair(ctx, active.id).role_name(role))
    actions.note(
        "Normal",
        EventReason.RECREATE,
        f"transfer format changes {old_format} -> {ctx.transfer_format}: stopping the "
        f"router and both roles of pair {active.id} before starting revision {ctx.revision}",
    )
    actions.wait()
    return Progress(
        ConditionReason.RECREATING, "stopping the old pair before starting the new format"
    )


def _blue_green(actions: Actions, ctx: RenderContext, active: Pair) -> Progress:
    """Incompatible change, BlueGreen: new pair, then the router, then (later) the old pair."""
    green = _with_pair(ctx, ctx.revision)
    objs = [o for role in reversed(ROLES) for o in render_role(green, role)]
    if not actions.ensure(objs):
        actions.note(
            "Normal",
            EventReason.BLUE_GREEN_STARTED,
            f"starting pair {green.pair} (format {ctx.transfer_format}) next to pair "
            f"{active.id}; the router stays on {active.id} until it is ready",
        )
        actions.wait()
        return Progress(ConditionReason.BLUE_GREEN, f"creating pair {green.pair}")
    pairs = actions.world.pairs()
    new = pairs.get(green.pair)
    if new is None or not all(new.rolled(role) for role in ROLES):
        actions.wait()
        return Progress(ConditionReason.BLUE_GREEN, f"waiting for pair {green.pair} to be ready")
    actions.ensure(render_router(green))
    actions.note("Normal", EventReason.ROUTER_SWITCHED, f"router now targets pair {green.pair}")
    actions.wait()
    return Progress(ConditionReason.SWITCHING_ROUTER, f"router switching to pair {green.pair}")


def _rollout(actions: Actions, ctx: RenderContext, spec: DSV4DeploymentSpec) -> Progress:
    world = actions.world
    unavailable = groups_unavailable(actions, ctx)
    if unavailable is not None:
        return unavailable
    if not spec.monitoring.service_monitor.enabled:
        actions.remove(SERVICE_MONITOR, ctx.name)
    pairs = world.pairs()
    active_id = world.active_pair_id()
    if active_id is None:
        # No pair: a router could only point at stale names; it goes first. Its pods too
        # must be gone, since a terminating router still holds DNS names the new pair reuses.
        actions.remove(DEPLOYMENT, router_name(ctx.name))
        leftovers = world.pods
        if leftovers:
            actions.wait()
            return Progress(
                ConditionReason.RECREATING, f"waiting for {len(leftovers)} old pod(s) to stop"
            )
        fresh = not actions.ensure(
            [o for role in reversed(ROLES) for o in render_role(ctx, role)]
            + render_router(ctx)
            + _shared(actions.world, ctx)
        )
        if fresh:
            actions.note(
                "Normal",
                EventReason.CREATING,
                f"creating revision {ctx.revision} (format {ctx.transfer_format})",
                revision=ctx.revision,
            )
            actions.wait()
            return Progress(ConditionReason.CREATING, f"creating revision {ctx.revision}")
        return Progress.done()
    active = pairs[active_id]
    formats = active.formats
    if formats == {ctx.transfer_format}:
        # Also when a role's StatefulSet was deleted: what is left speaks the same format, so
        # the missing role is recreated alone (a Recreate would stop a working router).
        return _roll_in_place(actions, ctx, active, pairs)
    old_format = ",".join(sorted(formats))
    if spec.rollout.strategy == "BlueGreen" and active.complete and len(formats) == 1:
        return _blue_green(actions, ctx, active)
    return _recreate(actions, ctx, active, old_format)


def _weights(
    actions: Actions, ctx: RenderContext, settings: ReconcileSettings
) -> tuple[WeightsState | None, Progress | None]:
    """Weights of a DSV4Model (docs/models.md): an inline Hub repo creates or adopts the model
    of the deployment's name; the rollout waits (running children keep serving) until the
    model says its download is verified. The model's claim, Job and progress are its own."""
    ref = ctx.spec.model.cache.model
    inline = inline_model(ctx)
    if inline is None and ref is None:
        return None, None
    if inline is not None:
        actions.ensure([inline])
    model_name = ref.name if ref is not None else ctx.name
    model = actions.world.live(MODEL_KIND, model_name)
    state = deployment_weights(model, model_name, ctx.spec.model.name, inline)
    if not state.ready:
        was = next((c for c in actions.world.status.conditions if c.type == "WeightsReady"), None)
        if was is None or was.reason != state.reason:
            ok = state.reason in WEIGHTS_UNDER_WAY
            reason = weights_event_reason(state.reason)
            actions.note("Normal" if ok else "Warning", reason, state.message)
        actions.wait()
        return state, Progress(ConditionReason.WAITING_FOR_WEIGHTS, state.message)
    return state, None


def _revisions(
    actions: Actions, contexts: list[RenderContext], settings: ReconcileSettings, keep: set[str]
) -> None:
    """Store each context's config once; prune the oldest beyond the history limit."""
    world = actions.world
    number = next_number(world.revisions)
    for ctx in {c.revision: c for c in contexts}.values():
        name = revision_name(ctx.name, ctx.revision)
        if world.revision(name) is None:
            actions.decision.create.append(controller_revision(ctx, number))
            number += 1
            stored = f"stored engine config revision {ctx.revision}"
            if not _told_with_creating(actions.decision, ctx.revision, f"{stored} as {name}"):
                actions.note("Normal", EventReason.REVISION_CREATED, stored)
    keep = keep | {c.revision for c in contexts}
    for name in to_prune(world.revisions, settings.revision_history_limit, keep):
        actions.decision.delete.append((CONTROLLER_REVISION, name))


def _told_with_creating(decision: Decision, revision: str, stored: str) -> bool:
    """A first pair's Creating Event says its config was stored too: one Event (one request)
    for what a user reads as one step, not a separate RevisionCreated."""
    for i, note in enumerate(decision.events):
        if note.reason == EventReason.CREATING and note.revision == revision:
            decision.events[i] = dataclasses.replace(note, message=f"{note.message}; {stored}")
            return True
    return False


def _invalid(actions: Actions, validation: Validation) -> None:
    message = _invalid_message(validation)
    was = next((c for c in actions.world.status.conditions if c.type == "Validated"), None)
    if was is None or was.status != "False" or was.message != message:
        actions.note("Warning", EventReason.INVALID, message)


def _invalid_message(validation: Validation) -> str:
    ids = validation.rule_ids("error")
    first = validation.errors[0]
    return (
        f"spec rejected by {', '.join(ids)}: {first.field}: {first.message}"
        + ("" if len(validation.errors) == 1 else f" (+{len(validation.errors) - 1} more)")
        + "; nothing was rolled out, running children keep their config"
    )


def _bake_wake(world: World, spec: DSV4DeploymentSpec, guard: GuardDecision) -> float | None:
    """Seconds until a passing revision has baked (no watch event marks that moment)."""
    window = guard.guard
    if window is None or not window.passing_since or guard.last_known_good == window.revision:
        return None
    due = window.passing_since.at + spec.guard.bake_time.delta
    return max((due - world.now).total_seconds(), 1.0)


# How often a multi-node spec looks for LeaderWorkerSet again while it is not served.
GROUPS_RECHECK_SECONDS = 60.0


def _deadline_wake(
    status: DSV4DeploymentStatus, world: World, spec: DSV4DeploymentSpec
) -> float | None:
    """Seconds until the progress deadline passes (no watch event marks that moment either)."""
    progressing = next((c for c in status.conditions if c.type == "Progressing"), None)
    degraded = next((c for c in status.conditions if c.type == "Degraded"), None)
    if (
        progressing is None
        or progressing.status != "True"
        or progressing.last_transition_time is None
    ):
        return None
    if degraded is not None and degraded.reason == ConditionReason.PROGRESS_DEADLINE_EXCEEDED:
        return None
    weights = next((c for c in status.conditions if c.type == "WeightsReady"), None)
    health = Health(
        complete=False,
        progress_reason=progressing.reason,
        progress_message=progressing.message,
        step_since=progressing.last_transition_time.at,
        now=world.now,
        deadline_seconds=spec.progress_deadline_seconds,
        weights_reason=weights.reason if weights else None,
    )
    left = seconds_to_deadline(health)
    return None if left is None else max(left, 0.0) + 1.0


def _earliest(*delays: float | None) -> float | None:
    known = [d for d in delays if d is not None]
    return min(known) if known else None


def _monitoring_event(actions: Actions, status: DSV4DeploymentStatus) -> None:
    """One Warning when the ServiceMonitor cannot be applied (not one per pass)."""
    now = next((c for c in status.conditions if c.type == "MonitoringReady"), None)
    was = next((c for c in actions.world.status.conditions if c.type == "MonitoringReady"), None)
    if now is not None and now.status == "False" and (was is None or was.reason != now.reason):
        actions.note("Warning", now.reason, now.message)


def _plan_event(actions: Actions, status: DSV4DeploymentStatus) -> None:
    """One Warning when an engine pod reports other numbers than the plan (per new message)."""
    now = next((c for c in status.conditions if c.type == "PlanVerified"), None)
    was = next((c for c in actions.world.status.conditions if c.type == "PlanVerified"), None)
    if (
        now is not None
        and now.reason == ConditionReason.PLAN_MISMATCH
        and (was is None or (was.reason, was.message) != (now.reason, now.message))
    ):
        actions.note("Warning", EventReason.PLAN_MISMATCH, now.message)


def decide(world: World, settings: ReconcileSettings | None = None) -> Decision:
    """One reconcile pass."""
    settings = settings or ReconcileSettings()
    actions = Actions(world)
    validation = world.validation
    if not validation.valid or validation.spec is None:
        _invalid(actions, validation)
        actions.decision.status = with_group_restarts(
            actions, invalid_spec_status(world, validation, _invalid_message(validation))
        )
        return actions.decision
    # A referenced DSV4Model's revision is the engines' (--revision) and part of the config.
    spec = with_model_source(validation.spec, world)
    owner = OwnerRef(API_VERSION, KIND, world.name, world.uid)
    user = dataclasses.replace(
        build_context(world.name, world.namespace, spec, owner, memory_plan=validation.plan),
        operator_image=settings.operator_image,
    )
    target, guard = guard_pass(world, spec, user, owner)
    if target is not None:
        target = dataclasses.replace(target, operator_image=settings.operator_image)
    decision = actions.decision
    decision.events += guard.events
    decision.ooms, decision.rollbacks, decision.cleared = guard.ooms, guard.rollbacks, guard.cleared
    weights: WeightsState | None = None
    if target is None:
        progress = Progress(ConditionReason.QUARANTINED, guard.no_known_good or "quarantined")
        target = user
    else:
        weights, waiting = _weights(actions, target, settings)
        progress = waiting or _rollout(actions, target, target.spec)
    keep = {p.revision(r) or "" for p in world.pairs().values() for r in ROLES}
    keep |= {str(guard.last_known_good or ""), user.revision}
    _revisions(actions, [target, user], settings, keep)
    decision.plan = plan_check(world, spec, target)
    decision.status = with_group_restarts(
        actions,
        rollout_status(world, validation, target, progress, guard, weights, decision.plan),
    )
    _monitoring_event(actions, decision.status)
    _plan_event(actions, decision.status)
    decision.requeue_after = _earliest(
        _bake_wake(world, spec, guard),
        _deadline_wake(decision.status, world, spec),
        # A pod that stays not ready with no cause in its status: its Events are read then,
        # and again while it stays so.
        seconds_until_causes_due(world.pods, world.pod_events, world.now),
        # No watch on CRDs: look for LeaderWorkerSet again (the watch cache rediscovers it).
        GROUPS_RECHECK_SECONDS if progress.reason == ConditionReason.GROUPS_UNAVAILABLE else None,
    )
    return decision


__all__ = ["decide"]

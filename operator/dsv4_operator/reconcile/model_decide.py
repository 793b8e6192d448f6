"""decide_model(): one DSV4Model pass, pure. ModelWorld in, ModelDecision out.

The model holds the finalizer dsv4.io/model-in-use from its first pass; deleting it removes
the finalizer (and the garbage collector its claim and Jobs) only once no DSV4Deployment
references it. Until then the download runs as it did and the status names the users.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsv4_operator.api.models import DSV4ModelStatus, ModelPhase
from dsv4_operator.api.status import Condition, ConditionType
from dsv4_operator.api.times import Timestamp
from dsv4_operator.events import EventType, Note
from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import JOB, Resource
from dsv4_operator.names import MODEL_FINALIZER, weights_claim_name
from dsv4_operator.reasons import (
    ConditionReason,
    EventReason,
    WeightsReason,
    weights_event_reason,
)
from dsv4_operator.reconcile.diff import to_apply
from dsv4_operator.reconcile.health import WEIGHTS_UNDER_WAY
from dsv4_operator.reconcile.model_world import ModelWorld
from dsv4_operator.reconcile.pod_causes import seconds_until_causes_due
from dsv4_operator.reconcile.weights import WeightsState, stale_jobs, weights_state
from dsv4_operator.render.weights import ModelContext, render_weights

# No watch on Secrets: look for a missing token Secret again after this long.
SECRET_RECHECK_SECONDS = 15.0


@dataclass
class ModelDecision:
    """What act_model() does."""

    apply: list[Obj] = field(default_factory=list)
    delete: list[tuple[Resource, str]] = field(default_factory=list)
    # The finalizers to write (None: as they are).
    finalizers: list[str] | None = None
    status: DSV4ModelStatus = field(default_factory=DSV4ModelStatus)
    events: list[Note] = field(default_factory=list)
    requeue_after: float | None = None

    def note(self, type_: EventType, reason: str, message: str) -> None:
        self.events.append(Note(type_, reason, message))


def _condition(
    world: ModelWorld, type_: ConditionType, ok: bool, reason: str, message: str
) -> Condition:
    status = "True" if ok else "False"
    previous = next((c for c in world.status.conditions if c.type == type_), None)
    kept = previous is not None and previous.status == status
    since = previous.last_transition_time if kept and previous is not None else None
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since or Timestamp.of(world.now),
        observed_generation=world.generation,
    )


def _finalizers(world: ModelWorld) -> list[str] | None:
    """Held from the first pass; dropped once a deleted model has no users."""
    held = MODEL_FINALIZER in world.finalizers
    if world.deleting and not world.users and held:
        return [f for f in world.finalizers if f != MODEL_FINALIZER]
    if not world.deleting and not held:
        return [*world.finalizers, MODEL_FINALIZER]
    return None


def _in_use(world: ModelWorld, decision: ModelDecision) -> Condition:
    users = ", ".join(world.users)
    if world.deleting and world.users:
        message = (
            f"deleted while DSV4Deployment(s) {users} reference it: it and its weights stay "
            "until they are deleted or reference another model"
        )
        was = next((c for c in world.status.conditions if c.type == "InUse"), None)
        if was is None or was.reason != ConditionReason.DELETION_WAITS or was.message != message:
            decision.note("Warning", EventReason.MODEL_IN_USE, message)
        return _condition(world, "InUse", True, ConditionReason.DELETION_WAITS, message)
    if world.users:
        message = f"used by DSV4Deployment(s) {users}; deleting this model waits for them"
        return _condition(world, "InUse", True, ConditionReason.REFERENCED, message)
    message = "no DSV4Deployment references this model; deleting it deletes its weights"
    return _condition(world, "InUse", False, ConditionReason.UNUSED, message)


def _phase(world: ModelWorld, state: WeightsState) -> ModelPhase:
    if world.deleting:
        return "Terminating"
    if state.ready:
        return "Ready"
    if state.reason in (WeightsReason.DOWNLOADING, WeightsReason.VERIFYING):
        return "Downloading"
    return "Pending" if state.reason in WEIGHTS_UNDER_WAY else "Failed"


def _download(world: ModelWorld, ctx: ModelContext, decision: ModelDecision) -> WeightsState:
    """The claim, the Job and its rights applied (none before the token Secret exists, none
    new once the model is being deleted); stale Jobs deleted; an Event per new reason."""
    state = weights_state(world, ctx)
    if state.reason != WeightsReason.TOKEN_SECRET_MISSING and not world.deleting:
        for obj in render_weights(ctx):
            desired = to_apply(obj, world.live(obj["kind"], obj["metadata"]["name"]))
            if desired is not None:
                decision.apply.append(desired)
    for name in stale_jobs(world, ctx, state.ready):
        if world.live(JOB.kind, name) is not None:
            decision.delete.append((JOB, name))
    was = next((c for c in world.status.conditions if c.type == "WeightsReady"), None)
    if was is None or was.reason != state.reason:
        ok = state.ready or state.reason in WEIGHTS_UNDER_WAY
        reason = weights_event_reason(state.reason)
        decision.note("Normal" if ok else "Warning", reason, state.message)
    if state.reason == WeightsReason.TOKEN_SECRET_MISSING:
        decision.requeue_after = SECRET_RECHECK_SECONDS
    return state


def decide_model(world: ModelWorld, operator_image: str) -> ModelDecision:
    """One DSV4Model pass."""
    decision = ModelDecision(finalizers=_finalizers(world))
    if world.spec is None:
        invalid = f"the spec is invalid: {world.spec_error}"
        state = WeightsState(False, WeightsReason.PENDING, invalid)
    else:
        ctx = ModelContext(world.name, world.namespace, world.uid, world.spec, operator_image)
        state = _download(world, ctx, decision)
    decision.status = DSV4ModelStatus(
        phase=_phase(world, state),
        observed_generation=world.generation,
        claim_name=weights_claim_name(world.name),
        used_by=list(world.users),
        conditions=[
            _condition(world, "WeightsReady", state.ready, state.reason, state.message),
            _in_use(world, decision),
        ],
    )
    # A Job pod stuck with nothing in its status (a claim that does not mount): its Events.
    causes = seconds_until_causes_due(world.weights_pods, world.pod_events, world.now)
    if causes is not None:
        earlier = decision.requeue_after
        decision.requeue_after = causes if earlier is None else min(earlier, causes)
    return decision

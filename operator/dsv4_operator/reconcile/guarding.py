"""The guard's part of a reconcile pass: hand the world to guard/decision.py, map its target
revision back to a render context; and what a revision's plan and render say its engines
must report (the plan check, guard/plan.py). The decisions themselves are the guard's."""

from __future__ import annotations

import json
from functools import lru_cache

from dsv4_operator.api.roles import ROLES
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.guard.decision import GuardDecision, GuardInput, decide_guard
from dsv4_operator.guard.plan import PlanCheck, PlanExpectation, check_plan, rendered_args
from dsv4_operator.names import CLEAR_QUARANTINE_ANNOTATION, revision_name
from dsv4_operator.reconcile.groups import unrecorded_group_restarts
from dsv4_operator.reconcile.world import World
from dsv4_operator.render.context import OwnerRef, RenderContext, build_context


def _stored_json(world: World, revision: str | None) -> str | None:
    """The spec stored with `revision`'s ControllerRevision, as canonical JSON (a cache key)."""
    if not revision:
        return None
    stored = world.revision(revision_name(world.name, revision))
    if stored is None:
        return None
    return json.dumps(stored.spec, sort_keys=True)


@lru_cache(maxsize=256)
def _parsed(spec_json: str) -> DSV4DeploymentSpec | None:
    try:
        return DSV4DeploymentSpec.model_validate_json(spec_json)
    except ValueError:  # stored by an older version whose spec no longer parses
        return None


@lru_cache(maxsize=64)
def _render_stored(
    name: str, namespace: str, owner: OwnerRef, spec_json: str
) -> RenderContext | None:
    """A stored config does not change: its plan and launches are computed once, not per pass."""
    spec = _parsed(spec_json)
    return None if spec is None else build_context(name, namespace, spec, owner)


def stored_context(world: World, revision: str | None, owner: OwnerRef) -> RenderContext | None:
    """The render context of a stored ControllerRevision (the rollback target)."""
    spec_json = _stored_json(world, revision)
    if spec_json is None:
        return None
    return _render_stored(world.name, world.namespace, owner, spec_json)


def served_spec(world: World, revision: str | None) -> DSV4DeploymentSpec | None:
    """The spec stored with `revision` (what its children were rendered from), or None."""
    spec_json = _stored_json(world, revision)
    return None if spec_json is None else _parsed(spec_json)


def _settled_revision(world: World) -> str | None:
    """The revision every role of the active pair runs, rolled and ready; else None."""
    active = world.pairs().get(world.active_pair_id() or "")
    if active is None:
        return None
    revisions = {active.revision(role) for role in ROLES}
    if len(revisions) != 1 or not all(active.rolled(role) for role in ROLES):
        return None
    return next(iter(revisions))


def expectation(ctx: RenderContext) -> PlanExpectation:
    """What the engines of `ctx`'s revision must report: the plan's pool per role, the
    rendered arguments the operator owns, the spec's SGLang release."""
    return PlanExpectation(
        revision=ctx.revision,
        sglang_version=ctx.spec.engine.sglang_version,
        max_total_tokens={role: ctx.plan.roles[role].max_total_tokens for role in ROLES},
        args={role: rendered_args(ctx.launches[role].command) for role in ROLES},
    )


def plan_check(world: World, spec: DSV4DeploymentSpec, ctx: RenderContext) -> PlanCheck | None:
    """PlanVerified of `ctx`'s revision; None when the guard does not read the engines."""
    if not (spec.guard.enabled and spec.guard.engine.enabled):
        return None
    infos = world.canary.server_info if world.canary is not None else {}
    return check_plan(expectation(ctx), world.pods, infos)


def guard_pass(
    world: World, spec: DSV4DeploymentSpec, user: RenderContext, owner: OwnerRef
) -> tuple[RenderContext | None, GuardDecision]:
    """Which context to roll out (None: quarantined with nothing to fall back to), and why."""
    known_good = stored_context(world, world.status.last_known_good_revision, owner)
    checks = [plan_check(world, spec, ctx) for ctx in (user, known_good) if ctx is not None]
    outcome = decide_guard(
        GuardInput(
            deployment=world.name,
            policy=spec.guard,
            last_known_good=world.status.last_known_good_revision,
            previous=world.status.guard,
            quarantine=world.status.quarantine,
            conditions=world.status.conditions,
            snapshot=world.canary,
            pods=world.pods,
            user_revision=user.revision,
            known_good_target=known_good.revision if known_good else None,
            settled_revision=_settled_revision(world),
            cleared=world.annotations.get(CLEAR_QUARANTINE_ANNOTATION),
            now=world.now,
            plan_mismatch={c.revision: c.message for c in checks if c is not None and c.mismatch},
            group_restarts=[*world.status.group_restarts, *unrecorded_group_restarts(world)],
        )
    )
    if outcome.target is None:
        return None, outcome
    return (user if outcome.target == user.revision else known_good), outcome

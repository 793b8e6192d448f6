"""act(): carry out a Decision against the API server; post its Events."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import Conflict, NotFound
from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import DSV4, LEADER_WORKER_SET
from dsv4_operator.reconcile.actions import Decision
from dsv4_operator.reconcile.recorder import EventRecorder, Subject
from dsv4_operator.reconcile.world import World

Observe = Callable[[Obj], None]
# Takes the writes a pass leaves behind, to run after it (reconcile/trailing.py).
Trail = Callable[[Coroutine[Any, Any, None]], None]
# A first pair's children in flight at once, per reconcile (DSV4_WORKERS reconciles run at
# once): the children of one create do not wait on each other's round trips.
CHILD_APPLIES_AT_ONCE = 4


def ignore(_: Obj) -> None:
    return None


async def act(
    client: KubeClient,
    world: World,
    decision: Decision,
    recorder: EventRecorder | None = None,
    observe: Observe = ignore,
    trail: Trail | None = None,
) -> None:
    """Deletes first (Recreate must stop the old pair before anything new starts), then the
    children, then the status, the ControllerRevisions to store and the Events.

    The status is written after the children (when a field a user sees changed), except for a
    rollback: its quarantine entry is the only record of why the spec is not served, and the
    evidence (an OOM-killed pod) goes with the pods the rollback replaces. Written first, a
    crash between the two writes cannot make the next pass roll the failed revision out again.

    `observe` gets every object the API server returns for a write, so a watch cache can
    fold it in before the watch event arrives. `trail` (reconcile/trailing.py) takes the
    ControllerRevisions and Events, to be written after the pass: nothing in it reads them.
    Without it they are written here, beside the status.
    """
    status = decision.status.reconciled_wire()
    # Only a change a user would see is written: status.guard's live counts alone are not
    # (api/status.py LIVE_GUARD_FIELDS); they go with the next write and live in metrics.
    due = decision.status.visible_wire() != world.status.visible_wire()
    if decision.rollbacks and due:
        observe(await client.apply_status(DSV4, world.namespace, world.name, status))
        due = False
    for res, name in decision.delete:
        await client.delete(res, world.namespace, name)
    await _apply_children(client, world, decision.apply, observe)
    # After the children, so that none of them waits on a request it does not need. The
    # ControllerRevisions, the status and the Events do not depend on each other.
    recorder = recorder or EventRecorder(client)
    status_write = _write_status(client, world, status, observe) if due else _nothing()
    if trail is None or not (decision.create or decision.events):
        await asyncio.gather(status_write, _records(client, world, decision, recorder, observe))
        return
    await status_write
    trail(_records(client, world, decision, recorder, observe))


async def _records(
    client: KubeClient,
    world: World,
    decision: Decision,
    recorder: EventRecorder,
    observe: Observe,
) -> None:
    """The ControllerRevisions to store and the Events to post, together."""
    await asyncio.gather(
        _create_revisions(client, decision.create, observe),
        _post_events(recorder, world, decision),
    )


async def _apply_children(
    client: KubeClient, world: World, objs: list[Obj], observe: Observe
) -> None:
    """Children one after another, except a deployment's first pair: none of its children
    exists yet, so their order means nothing and they are applied CHILD_APPLIES_AT_ONCE at a
    time. An update keeps its order (decode before prefill before the router): a child the
    API server refuses stops the ones after it. So does a pair with a LeaderWorkerSet: its
    controller makes a headless Service of the set's name unless one exists, and that name is
    the role Service's (render/groups.py), so the Service must be there first."""
    concurrent = len(objs) > 1 and not any(o["kind"] == LEADER_WORKER_SET.kind for o in objs)
    if concurrent and all(world.live(o["kind"], o["metadata"]["name"]) is None for o in objs):
        gate = asyncio.Semaphore(CHILD_APPLIES_AT_ONCE)

        async def one(obj: Obj) -> None:
            async with gate:
                observe(await client.apply(obj))

        # Every apply ends before the pass does (none is left running behind a refusal, to
        # land after the pass reported it); the first refusal is then raised.
        results = await asyncio.gather(*(one(o) for o in objs), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return
    for obj in objs:
        observe(await client.apply(obj))


async def _create_revisions(client: KubeClient, objs: list[Obj], observe: Observe) -> None:
    # A ControllerRevision is only read once its revision has run (a bake, a rollback), and a
    # pass that stops before this creates it on the next pass.
    for obj in objs:
        try:
            observe(await client.create(obj))
        except Conflict:
            # Already there: a pass that read a cache the watch had not yet brought up to
            # date. Creates are only used for immutable objects (ControllerRevisions).
            continue


async def _write_status(
    client: KubeClient, world: World, status: dict[str, object], observe: Observe
) -> None:
    try:
        observe(await client.apply_status(DSV4, world.namespace, world.name, status))
    except NotFound:
        return  # deleted since the cache was read (a model's change enqueued it): done


async def _post_events(recorder: EventRecorder, world: World, decision: Decision) -> None:
    # One after another: a repeat of an Event just posted is aggregated into it.
    subject = Subject(world.namespace, world.name, world.uid)
    for note in decision.events:
        await recorder.post(subject, note, world.now)


async def _nothing() -> None:
    return None

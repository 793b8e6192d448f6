"""act(): carry out a Decision against the API server; post its Events."""

from __future__ import annotations

from collections.abc import Callable

from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import Conflict, NotFound
from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import DSV4
from dsv4_operator.reconcile.actions import Decision
from dsv4_operator.reconcile.recorder import EventRecorder, Subject
from dsv4_operator.reconcile.world import World

Observe = Callable[[Obj], None]


def ignore(_: Obj) -> None:
    return None


async def act(
    client: KubeClient,
    world: World,
    decision: Decision,
    recorder: EventRecorder | None = None,
    observe: Observe = ignore,
) -> None:
    """Deletes first (Recreate must stop the old pair before anything new starts), then the
    children, then the ControllerRevisions to store.

    The status is written after the children (when a field a user sees changed), except for a
    rollback: its quarantine entry is the only record of why the spec is not served, and the
    evidence (an OOM-killed pod) goes with the pods the rollback replaces. Written first, a
    crash between the two writes cannot make the next pass roll the failed revision out again.

    `observe` gets every object the API server returns for a write, so a watch cache can
    fold it in before the watch event arrives.
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
    for obj in decision.apply:
        observe(await client.apply(obj))
    # After the children, so that they start one request sooner: a ControllerRevision is only
    # read once its revision has run (a bake, a rollback), and a pass that stops before this
    # creates it on the next pass.
    for obj in decision.create:
        try:
            observe(await client.create(obj))
        except Conflict:
            # Already there: a pass that read a cache the watch had not yet brought up to
            # date. Creates are only used for immutable objects (ControllerRevisions).
            continue
    if due:
        try:
            observe(await client.apply_status(DSV4, world.namespace, world.name, status))
        except NotFound:
            return  # deleted since the cache was read (a model's change enqueued it): done
    recorder = recorder or EventRecorder(client)
    subject = Subject(world.namespace, world.name, world.uid)
    for note in decision.events:
        await recorder.post(subject, note, world.now)

"""act(): carry out a Decision against the API server; post its Events."""

from __future__ import annotations

import logging
from datetime import datetime

from dsv4_operator.events import Note
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import KubeError
from dsv4_operator.kube.resources import DSV4
from dsv4_operator.names import OPERATOR, format_time
from dsv4_operator.reconcile.actions import Decision
from dsv4_operator.reconcile.world import World

log = logging.getLogger(__name__)
REPORTING_COMPONENT = OPERATOR


async def post_event(client: KubeClient, world: World, note: Note, now: datetime) -> None:
    """A core/v1 Event on the DSV4Deployment; failures are logged, never fatal."""
    stamp = format_time(now)
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{world.name}.", "namespace": world.namespace},
        "involvedObject": {
            "apiVersion": DSV4.api_version,
            "kind": DSV4.kind,
            "name": world.name,
            "namespace": world.namespace,
            "uid": world.uid,
        },
        "type": note.type,
        "reason": note.reason,
        "message": note.message[:1024],
        "source": {"component": REPORTING_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        await client.create(event)
    except KubeError as error:
        log.warning(
            "could not post event %s on %s/%s: %s", note.reason, world.namespace, world.name, error
        )


async def act(client: KubeClient, world: World, decision: Decision) -> None:
    """Deletes first (Recreate must stop the old pair before anything new starts)."""
    for res, name in decision.delete:
        await client.delete(res, world.namespace, name)
    for obj in decision.create:
        await client.create(obj)
    for obj in decision.apply:
        await client.apply(obj)
    status = decision.status.to_wire()
    if status != world.status.to_wire():
        await client.apply_status(DSV4, world.namespace, world.name, status)
    for note in decision.events:
        await post_event(client, world, note, world.now)

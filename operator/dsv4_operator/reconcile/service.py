"""One reconcile pass for one key: gather -> decide -> act, with an injectable clock."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dsv4_operator.kube.client import KubeClient
from dsv4_operator.reconcile.act import act
from dsv4_operator.reconcile.decide import Settings, decide
from dsv4_operator.reconcile.gather import gather

log = logging.getLogger(__name__)
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class Reconciler:
    """Binds the client, settings and clock; called by the work queue with a key."""

    def __init__(self, client: KubeClient, settings: Settings, clock: Clock = utc_now) -> None:
        self.client = client
        self.settings = settings
        self.clock = clock

    async def __call__(self, key: tuple[str, str]) -> float | None:
        namespace, name = key
        world = await gather(self.client, namespace, name, self.clock())
        if world is None:
            return None
        decision = decide(world, self.settings)
        if decision.writes or decision.events:
            progressing: dict[str, Any] = next(
                (c for c in decision.status.get("conditions", []) if c["type"] == "Progressing"),
                {},
            )
            log.info(
                "%s/%s: phase %s (%s); apply %s; delete %s; create %d; events: %s",
                namespace,
                name,
                decision.status.get("phase"),
                progressing.get("message"),
                [o["metadata"]["name"] for o in decision.apply] or "-",
                [n for _, n in decision.delete] or "-",
                len(decision.create),
                "; ".join(f"{n.reason}: {n.message}" for n in decision.events) or "-",
            )
        await act(self.client, world, decision)
        return decision.requeue_after

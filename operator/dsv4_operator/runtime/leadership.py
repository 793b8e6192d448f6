"""Who reconciles: the replica holding the Lease runs the work queue and the guard; the others
keep their watch caches warm (a takeover starts from a synced cache) and serve the webhook."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from dsv4_operator import metrics
from dsv4_operator.kube.resources import DSV4, DSV4_MODEL
from dsv4_operator.names import MODEL_KEY_PREFIX
from dsv4_operator.runtime.cache import WatchCache
from dsv4_operator.runtime.lease import LeaderElector
from dsv4_operator.runtime.queue import WorkQueue
from dsv4_operator.runtime.specs import OwnerSpecs
from dsv4_operator.signals.supervisor import GuardSupervisor

log = logging.getLogger(__name__)


class Leadership:
    """Runs the queue and the guards while leading (always, without an elector)."""

    def __init__(
        self,
        cache: WatchCache,
        queue: WorkQueue,
        guards: GuardSupervisor,
        elector: LeaderElector | None,
        specs: OwnerSpecs,
    ) -> None:
        self.cache, self.queue, self.guards, self.elector = cache, queue, guards, elector
        self.specs = specs
        self.leading = asyncio.Event()
        self.work: asyncio.Task[None] | None = None
        self.renewing: asyncio.Task[None] | None = None

    async def run(self) -> None:
        await self.cache.wait_synced()
        if self.elector is not None:
            log.info("waiting for the lease %s/%s", self.elector.namespace, self.elector.name)
            await self.elector.acquire()
        self.leading.set()
        metrics.LEADER.set(1)
        # Guards start for what the standby's cache already holds; keys queued while waiting
        # (the cache's changes) are reconciled first.
        for namespace, name in self.cache.keys(DSV4):
            owner = await self.cache.get(DSV4, namespace, name)
            if owner is not None:
                self.guards.ensure((namespace, name), self.specs.spec(owner))
                self.guards.saw_status((namespace, name), owner.get("status"))
                self.guards.saw_owner((namespace, name), owner)  # resumes a culprit search
                self.queue.add((namespace, name), owner["metadata"].get("generation"))
        for namespace, name in self.cache.keys(DSV4_MODEL):
            self.queue.add((namespace, MODEL_KEY_PREFIX + name))
        self.work = work = asyncio.create_task(self.queue.run())
        if self.elector is None:
            await work
            return
        self.renewing = held = asyncio.create_task(self.elector.hold())
        await asyncio.wait({work, held}, return_when=asyncio.FIRST_COMPLETED)
        if held.done():
            # Lost: stop writing at once, then stop the process (the Deployment restarts it as
            # a standby), as controller-runtime does.
            await self.stop()
            self.leading.clear()  # nothing to release: the Lease is someone else's now
            metrics.LEADER.set(0)
            log.error("leadership lost; stopping so that only the new leader writes")
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            held.cancel()

    async def stop(self) -> None:
        """No reconcile, no canary and no Lease renewal runs after this returns (a renewal
        racing `release()` would make the release a stale write the API server refuses)."""
        if self.work is not None:
            await cancel(self.work)
        if self.renewing is not None:
            await cancel(self.renewing)
        await self.guards.close()

    async def release(self) -> None:
        if self.elector is not None and self.leading.is_set():
            await self.elector.release()
            self.leading.clear()
            metrics.LEADER.set(0)


async def cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

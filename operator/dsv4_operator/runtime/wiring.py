"""The operator as one typed object: `build_operator` wires it from the settings (no I/O);
`start()` and `stop()` run and end it, inside kopf's startup and cleanup."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import kopf

from dsv4_operator import metrics
from dsv4_operator.guard.observations import Observations
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.reconcile.actions import ReconcileSettings
from dsv4_operator.reconcile.service import Reconciler
from dsv4_operator.runtime.cache import WatchCache
from dsv4_operator.runtime.leadership import Leadership, cancel
from dsv4_operator.runtime.lease import LeaderElector, Timing
from dsv4_operator.runtime.metered import (
    CountedReconciler,
    count_list,
    count_request,
    count_watch_error,
)
from dsv4_operator.runtime.queue import WorkQueue
from dsv4_operator.runtime.specs import OwnerSpecs
from dsv4_operator.runtime.watched import WATCHED, enqueue_owner, watchable
from dsv4_operator.settings import OperatorSettings
from dsv4_operator.signals.bisector import Bisector, BisectTiming
from dsv4_operator.signals.canary_runner import probe_runner
from dsv4_operator.signals.http import GuardHttp
from dsv4_operator.signals.supervisor import GuardSupervisor

log = logging.getLogger(__name__)
# At shutdown, how long the last passes' revisions and Events may take to be written.
TRAILING_DRAIN_SECONDS = 5.0


@dataclass
class Operator:
    """Everything a running operator holds; the watch cache's changes enqueue keys, the
    work queue runs reconciles, leadership decides whether this replica runs them."""

    settings: OperatorSettings
    client: KubeClient
    cache: WatchCache
    observations: Observations
    reconciler: Reconciler
    queue: WorkQueue
    guards: GuardSupervisor
    http: GuardHttp  # the guard's clients: made once here, closed last
    leadership: Leadership
    leading: asyncio.Task[None] | None = None  # leadership.run(), once started

    async def start(self) -> None:
        # The streams start here, on kopf's event loop and with its login (a startup handler
        # runs in the context that holds kopf's credentials); reconciles start once every
        # kind is listed (no pass decides on a half-filled cache) and this replica leads.
        await self.cache.start()
        self.leading = asyncio.create_task(self.leadership.run())
        if self.settings.metrics_port:
            metrics.serve(self.settings.metrics_port, self.settings.listen_host)

    async def stop(self) -> None:
        await self.leadership.stop()
        if self.leading is not None:
            await cancel(self.leading)
        # The last passes' ControllerRevisions and Events, while the client is still open.
        left = await self.reconciler.trailing.drain(TRAILING_DRAIN_SECONDS)
        if left:
            log.warning("stopped with %d deployment(s)' revisions or Events unwritten", left)
        await self.leadership.release()  # a standby takes over now, not after the lease expires
        await self.cache.close()
        await self.client.close()
        await self.http.close()


def build_operator(op: OperatorSettings, kopf_settings: kopf.OperatorSettings) -> Operator:
    """The operator, wired and not started. `kopf_settings` are the running kopf's: the
    watch streams use its watching settings and the cache adds its label selectors there."""
    client = KubeClient.from_environment(field_manager=op.field_manager, on_request=count_request)
    cache = WatchCache(
        kopf_settings,
        WATCHED,
        op.namespace_list or None,
        discover=watchable(client, op.namespace_list),
        on_list=count_list,
        on_watch_error=count_watch_error,
    )
    observations = Observations()
    reconciler = CountedReconciler(
        client,
        ReconcileSettings(
            revision_history_limit=op.revision_history_limit,
            trust=op.trust_policy,
            operator_image=op.operator_image,
        ),
        observations=observations,
        cache=cache,
    )
    queue = WorkQueue(
        reconciler,
        workers=op.workers,
        resync_seconds=op.resync_seconds,
        backoff_max=op.retry_backoff_max_seconds,
    )
    reconciler.gone = queue.gone
    reconciler.retry = queue.add_after
    http = GuardHttp.create()
    guards = GuardSupervisor(
        cache,
        observations,
        wake=queue.add,
        http=http,
        policy=op.trust_policy,
        canaries_at_once=op.guard_canaries_at_once,
        idle_reads_every=op.guard_idle_read_seconds,
        reads_at_once=op.guard_reads_at_once,
        bisector=Bisector(
            client,
            # Through each shadow pair's router Service, as the guard's canary reaches the
            # serving router: by name, with the environment's proxy settings.
            probe_runner(http.canary),
            op.bisect_priority_class,
            BisectTiming(poll_seconds=op.bisect_poll_seconds),
        ),
    )
    elector = (
        LeaderElector(
            client,
            op.lease_namespace,
            op.lease_name,
            op.identity,
            Timing.for_duration(op.lease_duration_seconds),
            owner=op.lease_owner,
        )
        if op.leader_election
        else None
    )
    specs = OwnerSpecs(reconciler.validations, op.trust_policy)  # one parse for both
    leadership = Leadership(cache, queue, guards, elector, specs)
    # The cache is read by all of the above and tells them of changes: its listener last.
    cache.listener = enqueue_owner(queue, guards, reconciler, leadership, specs)
    return Operator(
        op, client, cache, observations, reconciler, queue, guards, http, leadership, leading=None
    )

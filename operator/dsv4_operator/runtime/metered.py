"""What the runtime counts, wired to metrics.py: API requests, the watch cache's lists and
failed streams, and each reconcile's duration and outcome."""

from __future__ import annotations

from dsv4_operator import metrics
from dsv4_operator.kube.resources import Resource
from dsv4_operator.reconcile.service import Reconciler


def count_request(verb: str, resource: str) -> None:
    counter = metrics.READS if verb in ("get", "list", "dryrun") else metrics.WRITES
    counter.labels(verb, resource).inc()


def count_list(res: Resource) -> None:
    metrics.WATCH_LISTS.labels(res.plural).inc()


def count_watch_error(res: Resource) -> None:
    metrics.WATCH_ERRORS.labels(res.plural).inc()


class CountedReconciler(Reconciler):
    """The reconciler, timed and counted by outcome (ok, error)."""

    async def __call__(self, key: tuple[str, str]) -> float | None:
        with metrics.RECONCILE_SECONDS.time():
            try:
                again = await super().__call__(key)
            except Exception:
                metrics.RECONCILES.labels("error").inc()
                raise
        metrics.RECONCILES.labels("ok").inc()
        return again

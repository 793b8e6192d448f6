"""What the operator watches, and what a change it sees does: enqueue the owner's key."""

from __future__ import annotations

import logging

from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import Forbidden
from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import (
    CONTROLLER_REVISION,
    DEPLOYMENT,
    DSV4,
    PDB,
    POD,
    SERVICE,
    SERVICE_MONITOR,
    STATEFULSET,
    WEIGHTS_KINDS,
    Resource,
)
from dsv4_operator.names import DEPLOYMENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from dsv4_operator.reconcile.service import Reconciler
from dsv4_operator.runtime.cache import Discover, Listener, Watched
from dsv4_operator.runtime.leadership import Leadership
from dsv4_operator.runtime.queue import WorkQueue
from dsv4_operator.runtime.specs import OwnerSpecs
from dsv4_operator.signals.supervisor import GuardSupervisor

log = logging.getLogger(__name__)

# Every kind a reconcile reads, kept by the watch cache. Children and their pods carry the
# operator's labels, so the API server filters them (never every pod in the cluster).
CHILD_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY},{DEPLOYMENT_LABEL}"
WATCHED = (
    Watched(DSV4),
    *(
        Watched(res, label_selector=CHILD_SELECTOR)
        for res in (STATEFULSET, DEPLOYMENT, SERVICE, PDB, CONTROLLER_REVISION, POD)
    ),
    *(Watched(res, label_selector=CHILD_SELECTOR) for res in WEIGHTS_KINDS),
    Watched(SERVICE_MONITOR, label_selector=CHILD_SELECTOR, optional=True),
)


def watchable(client: KubeClient, namespaces: list[str]) -> Discover:
    """Whether an optional kind (ServiceMonitor) is served and the operator may list it."""

    async def check(res: Resource) -> bool:
        if not await client.serves(res):
            return False
        try:
            scopes: list[str | None] = list(namespaces) or [None]
            for namespace in scopes:
                await client.list(res, namespace, {MANAGED_BY_LABEL: MANAGED_BY})
        except Forbidden:
            log.warning(
                "not watching %s: RBAC does not allow listing them (chart value "
                "rbac.serviceMonitors); spec.monitoring.serviceMonitor cannot be applied",
                res.plural,
            )
            return False
        return True

    return check


def enqueue_owner(
    queue: WorkQueue,
    guards: GuardSupervisor,
    reconciler: Reconciler,
    leadership: Leadership,
    specs: OwnerSpecs,
) -> Listener:
    """What a change seen by the watch cache does: enqueue the owner; (re)start its guard with
    the spec, parsed once per generation."""

    def changed(res: Resource, obj: Obj, deleted: bool) -> None:
        meta = obj["metadata"]
        namespace = meta.get("namespace") or ""
        if res == DSV4:
            key = (namespace, meta["name"])
            if deleted:
                queue.forget(key)
                guards.deleted(key)
                specs.forget(key)
                reconciler.forget(key)  # its canary window and metric series
            else:
                queue.add(key, meta.get("generation"))
                if leadership.leading.is_set():  # a standby runs no canary
                    guards.ensure(key, specs.spec(obj))
                    guards.saw_status(key, obj.get("status"))  # the served revision's changes
                    guards.saw_owner(key, obj)  # a rollback's culprit search
            return
        owner = (meta.get("labels") or {}).get(DEPLOYMENT_LABEL)
        if owner:
            queue.add((namespace, owner))

    return changed

"""What the operator watches, and what a change it sees does: enqueue the owner's key."""

from __future__ import annotations

import logging

from dsv4_operator.api.models import model_name_of
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import Forbidden
from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import (
    CONTROLLER_REVISION,
    DEPLOYMENT,
    DSV4,
    DSV4_MODEL,
    LEADER_WORKER_SET,
    PDB,
    POD,
    SERVICE,
    SERVICE_MONITOR,
    STATEFULSET,
    WEIGHTS_KINDS,
    Resource,
)
from dsv4_operator.names import (
    CREATED_FOR_LABEL,
    DEPLOYMENT_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MODEL_KEY_PREFIX,
    MODEL_LABEL,
)
from dsv4_operator.pods import POD_SPEC_FIELDS_READ
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
# A DSV4Model's claim, download Jobs and their rights carry the model label instead.
MODEL_CHILD_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY},{MODEL_LABEL}"
# Pods: the engines' and the router's (deployment label) and the download Jobs' (model label).
POD_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
# The StatefulSet controller's own ControllerRevisions carry the pod template's labels (ours)
# and its hash label; only the operator's (the DSV4Deployment's revisions) are read. Kept,
# they were two thirds of the revisions cached and woke a pass on every template change.
STATEFULSET_REVISION_HASH_LABEL = "controller.kubernetes.io/hash"
REVISION_SELECTOR = f"{CHILD_SELECTOR},!{STATEFULSET_REVISION_HASH_LABEL}"
WATCHED = (
    Watched(DSV4),
    # Optional: an operator upgraded before its CRD (crds.enabled=false) keeps serving the
    # deployments that use no DSV4Model, and picks the kind up once it is served.
    Watched(DSV4_MODEL, optional=True),
    *(
        Watched(res, label_selector=CHILD_SELECTOR)
        for res in (STATEFULSET, DEPLOYMENT, SERVICE, PDB)
    ),
    Watched(CONTROLLER_REVISION, label_selector=REVISION_SELECTOR),
    Watched(POD, label_selector=POD_SELECTOR, spec_fields=POD_SPEC_FIELDS_READ),
    *(Watched(res, label_selector=MODEL_CHILD_SELECTOR) for res in WEIGHTS_KINDS),
    Watched(SERVICE_MONITOR, label_selector=CHILD_SELECTOR, optional=True),
    # Only multi-node roles need LWS: a cluster without it runs every single-node spec.
    Watched(LEADER_WORKER_SET, label_selector=CHILD_SELECTOR, optional=True),
)


def model_key(namespace: str, name: str) -> tuple[str, str]:
    """The work queue's key of a DSV4Model (names.MODEL_KEY_PREFIX)."""
    return (namespace, MODEL_KEY_PREFIX + name)


_UNWATCHED = {
    SERVICE_MONITOR.kind: "(chart value rbac.serviceMonitors) "
    "spec.monitoring.serviceMonitor cannot be applied",
    LEADER_WORKER_SET.kind: "multi-node roles cannot be rolled out",
}


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
                "not watching %s: RBAC does not allow listing them; %s",
                res.plural,
                _UNWATCHED.get(res.kind, "they cannot be applied"),
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
    the spec, parsed once per generation.

    A change the operator wrote itself (`own`) enqueues no one for its own sake: the pass that
    wrote it has just acted on it. It still wakes what depends on it across objects: a
    DSV4Model (created by its first user's pass, its status written by its own pass) wakes
    its pass and its users, and a deployment's status goes to its guard (a rollback's)."""

    def changed(res: Resource, obj: Obj, deleted: bool, own: bool = False) -> None:
        meta = obj["metadata"]
        namespace = meta.get("namespace") or ""
        if own and res not in (DSV4_MODEL, DSV4):
            return  # a child the owner's pass applied
        if res == DSV4_MODEL:
            if not deleted:
                queue.add(model_key(namespace, meta["name"]), meta.get("generation"))
            else:
                queue.forget(model_key(namespace, meta["name"]))
            # Its users learn of its progress (and a new user of its existence).
            users = set((obj.get("status") or {}).get("usedBy") or [])
            users.add((meta.get("labels") or {}).get(CREATED_FOR_LABEL) or meta["name"])
            for user in users:
                queue.add((namespace, user))
            return
        if res == DSV4:
            key = (namespace, meta["name"])
            if own:  # its own pass wrote it: only the guard hears of it
                if leadership.leading.is_set():
                    guards.saw_status(key, obj.get("status"))
                    guards.saw_owner(key, obj)
                return
            model = model_name_of(obj)
            if model is not None:  # its status names its users: a new or a gone one
                queue.add(model_key(namespace, model))
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
        labels = meta.get("labels") or {}
        owner = labels.get(DEPLOYMENT_LABEL)
        if res == POD:
            # Before the pass: LWS may delete a restarted group before any pass lists it.
            reconciler.group_capture.saw(obj, deleted)
        if owner:
            queue.add((namespace, owner))
        model = labels.get(MODEL_LABEL)
        if model:
            queue.add(model_key(namespace, model))

    return changed

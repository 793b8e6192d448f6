"""kopf registration: the watch cache's changes enqueue keys; the work queue runs reconciles."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf

from dsv4_operator import metrics
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.guard.daemon import GuardSupervisor
from dsv4_operator.guard.observations import Observations
from dsv4_operator.handlers import admission
from dsv4_operator.handlers.admission import ADMISSION_HANDLER_ID, AdmissionServer
from dsv4_operator.handlers.leadership import Leadership, cancel
from dsv4_operator.handlers.queue import WorkQueue
from dsv4_operator.kube.cache import Listener, WatchCache, Watched
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import Forbidden, KubeError
from dsv4_operator.kube.lease import LeaderElector
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
from dsv4_operator.reconcile.actions import ReconcileSettings
from dsv4_operator.reconcile.dry_run import refused_children
from dsv4_operator.reconcile.service import Reconciler
from dsv4_operator.settings import OperatorSettings, unknown_settings
from dsv4_operator.webhook_certs import self_signed

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


def _count_request(verb: str, resource: str) -> None:
    counter = metrics.READS if verb in ("get", "list", "dryrun") else metrics.WRITES
    counter.labels(verb, resource).inc()


class _Counted(Reconciler):
    async def __call__(self, key: tuple[str, str]) -> float | None:
        with metrics.RECONCILE_SECONDS.time():
            try:
                again = await super().__call__(key)
            except Exception:
                metrics.RECONCILES.labels("error").inc()
                raise
        metrics.RECONCILES.labels("ok").inc()
        return again


def _watchable(client: KubeClient, namespaces: list[str]) -> Callable[[Resource], Awaitable[bool]]:
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


def _on_change(memo: Any) -> Listener:
    """What a change seen by the watch cache does: enqueue the owner; (re)start its guard."""

    def changed(res: Resource, obj: dict[str, Any], deleted: bool) -> None:
        meta = obj["metadata"]
        namespace = meta.get("namespace") or ""
        if res == DSV4:
            key = (namespace, meta["name"])
            if deleted:
                memo.queue.forget(key)
                memo.guards.stop(key)
                memo.reconciler.forget(key)  # its canary window and metric series
            else:
                memo.queue.add(key, meta.get("generation"))
                if memo.leadership.leading.is_set():  # a standby runs no canary
                    memo.guards.ensure(key, dict(obj.get("spec") or {}))
            return
        owner = (meta.get("labels") or {}).get(DEPLOYMENT_LABEL)
        if owner:
            memo.queue.add((namespace, owner))

    return changed


def _webhook_server(op: OperatorSettings) -> AdmissionServer:
    cert_dir = op.webhook_cert_dir
    if cert_dir is None:  # local runs: a self-signed cert for the address the API server dials
        cert_dir = Path(tempfile.mkdtemp(prefix="dsv4-webhook-"))
        self_signed(cert_dir, [op.webhook_url_host or "localhost", "127.0.0.1"])
    crt, key = cert_dir / "tls.crt", cert_dir / "tls.key"
    return AdmissionServer(
        addr=op.listen_host,
        port=op.webhook_port,
        host=op.webhook_url_host,
        certfile=crt,
        pkeyfile=key,
        cafile=crt,
    )


def configure(settings: kopf.OperatorSettings, op: OperatorSettings) -> None:
    # No finalizer, progress or diff-base storage is configured: the operator registers only
    # event handlers (no on.create/update/delete, no kopf daemon or timer), for which kopf
    # never adds a finalizer nor stores handler progress or a last-handled state.
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING
    if op.webhook:
        settings.admission.server = _webhook_server(op)
        if op.webhook_url_host:  # local: kopf keeps the ValidatingWebhookConfiguration
            settings.admission.managed = f"{op.prefix}.validation"


@dataclass
class _Started:
    """What startup made that the admission handler needs (it has no memo of its own)."""

    client: KubeClient | None = None


def build_registry(op: OperatorSettings) -> kopf.OperatorRegistry:
    """All handlers of the operator, on a registry of their own."""
    registry = kopf.OperatorRegistry()
    started = _Started()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # In-cluster service account or KUBECONFIG, the same sources as KubeClient.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure(settings, op)
        client = KubeClient.from_environment(
            field_manager=op.field_manager, on_request=_count_request
        )
        started.client = client
        cache = WatchCache(
            settings,
            WATCHED,
            op.namespace_list or None,
            _on_change(memo),
            _watchable(client, op.namespace_list),
        )
        observations = Observations()
        reconciler = _Counted(
            client,
            ReconcileSettings(
                revision_history_limit=op.revision_history_limit,
                trust=op.trust_policy,
                operator_image=op.operator_image,
            ),
            observations=observations,
            cache=cache,
        )
        queue = WorkQueue(reconciler, workers=op.workers, resync_seconds=op.resync_seconds)
        memo.client, memo.queue, memo.cache, memo.reconciler = client, queue, cache, reconciler
        memo.guards = GuardSupervisor(cache, observations, wake=queue.add, policy=op.trust_policy)
        elector = (
            LeaderElector(client, op.lease_namespace, op.lease_name, op.identity, op.lease_timing)
            if op.leader_election
            else None
        )
        memo.leadership = Leadership(cache, queue, memo.guards, elector)
        # The streams start here, on kopf's event loop and with its login (a startup handler
        # runs in the context that holds kopf's credentials); reconciles start once every
        # kind is listed (no pass decides on a half-filled cache) and this replica leads.
        await cache.start()
        memo.task = asyncio.create_task(memo.leadership.run())
        if op.metrics_port:
            metrics.serve(op.metrics_port, op.listen_host)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        await memo.leadership.stop()
        await cancel(memo.task)
        await memo.leadership.release()  # a standby takes over now, not after the lease expires
        await memo.cache.close()
        await memo.client.close()

    if op.webhook:

        async def dry_run(name: str, namespace: str, spec: DSV4DeploymentSpec) -> list[str]:
            client = started.client
            if client is None:  # admission before startup finished: the rules alone
                raise KubeError(0, "NotStarted", "the operator's client is not ready yet")
            return await refused_children(client, name, namespace, spec)

        admission.register(registry, op.trust_policy, dry_run)
    return registry


class AdmissionDenials(logging.Filter):
    """kopf logs every refused admission as an ERROR ("Webhook 'rules' failed permanently:
    ..."); refusing an unsafe spec is the webhook doing its job, so it is logged at INFO as
    `admission denied: <why>`. Other errors pass unchanged."""

    PREFIX = f"Webhook {ADMISSION_HANDLER_ID!r} failed permanently: "

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno == logging.ERROR and message.startswith(self.PREFIX):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = f"admission denied: {message[len(self.PREFIX) :]}", None
        return True


def run(op: OperatorSettings) -> None:
    """Start the operator and block until it stops."""
    kopf.configure(
        verbose=op.log_level == "DEBUG",
        log_format=kopf.LogFormat.JSON if op.log_format == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger().setLevel(op.log_level)
    # One line per request or per watch event is noise; reconcile decisions are logged.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").addFilter(AdmissionDenials())
    for warning in unknown_settings(os.environ):
        log.warning(warning)
    namespaces = op.namespace_list
    kopf.run(
        registry=build_registry(op),
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=op.liveness_endpoint,
    )

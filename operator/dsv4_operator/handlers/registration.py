"""kopf registration: watch events enqueue keys; the work queue runs the reconciles."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from pathlib import Path
from typing import Any

import kopf

from dsv4_operator import metrics
from dsv4_operator.guard.daemon import GuardSupervisor
from dsv4_operator.guard.observations import Observations
from dsv4_operator.handlers import admission
from dsv4_operator.handlers.queue import WorkQueue
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.names import (
    DEPLOYMENT_LABEL,
    GROUP,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLURAL,
    VERSION,
)
from dsv4_operator.reconcile.actions import ReconcileSettings
from dsv4_operator.reconcile.service import Reconciler
from dsv4_operator.settings import OperatorSettings
from dsv4_operator.webhook_certs import self_signed

# Children whose changes move a rollout forward (ready replicas, deletions).
WATCHED_CHILDREN = (
    ("apps", "v1", "statefulsets"),
    ("apps", "v1", "deployments"),
    ("", "v1", "pods"),
)


class _Counted(Reconciler):
    async def __call__(self, key: tuple[str, str]) -> float | None:
        before = self.client.writes
        with metrics.RECONCILE_SECONDS.time():
            try:
                again = await super().__call__(key)
            except Exception:
                metrics.RECONCILES.labels("error").inc()
                raise
            finally:
                metrics.WRITES.inc(self.client.writes - before)
        metrics.RECONCILES.labels("ok").inc()
        return again


def _webhook_server(op: OperatorSettings) -> kopf.WebhookServer:
    cert_dir = op.webhook_cert_dir
    if cert_dir is None:  # local runs: a self-signed cert for the address the API server dials
        cert_dir = Path(tempfile.mkdtemp(prefix="dsv4-webhook-"))
        self_signed(cert_dir, [op.webhook_url_host or "localhost", "127.0.0.1"])
    crt, key = cert_dir / "tls.crt", cert_dir / "tls.key"
    return kopf.WebhookServer(
        addr=op.webhook_host,
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


def build_registry(op: OperatorSettings) -> kopf.OperatorRegistry:
    """All handlers of the operator, on a registry of their own."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # In-cluster service account or KUBECONFIG, the same sources as KubeClient.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure(settings, op)
        client = KubeClient.from_environment(field_manager=op.field_manager)
        observations = Observations()
        reconciler = _Counted(
            client,
            ReconcileSettings(
                revision_history_limit=op.revision_history_limit, trust=op.trust_policy
            ),
            observations=observations,
        )
        queue = WorkQueue(reconciler, workers=op.workers, resync_seconds=op.resync_seconds)
        memo.client, memo.queue = client, queue
        memo.guards = GuardSupervisor(client, observations, wake=queue.add, policy=op.trust_policy)
        memo.task = asyncio.create_task(queue.run())
        if op.metrics_port:
            metrics.serve(op.metrics_port)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        await memo.guards.close()
        memo.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await memo.task
        await memo.client.close()

    # Async handlers: they run on the operator's event loop, where the queue and the guard
    # tasks live (kopf runs sync handlers in a thread pool).
    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def owner_changed(
        event: kopf.RawEvent,
        name: str,
        namespace: str | None,
        meta: kopf.Meta,
        memo: Any,
        **_: Any,
    ) -> None:
        key = (namespace or "", name)
        if event["type"] == "DELETED":
            memo.queue.forget(key)
            memo.guards.stop(key)
        else:
            memo.queue.add(key, meta.get("generation"))
            memo.guards.ensure(key, dict(event["object"].get("spec") or {}))

    async def child_changed(
        namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
    ) -> None:
        owner = labels.get(DEPLOYMENT_LABEL)
        if owner and namespace:
            memo.queue.add((namespace, owner))

    for group, version, plural in WATCHED_CHILDREN:
        kopf.on.event(
            group,
            version,
            plural,
            registry=registry,
            labels={MANAGED_BY_LABEL: MANAGED_BY, DEPLOYMENT_LABEL: kopf.PRESENT},
            id=f"child-{plural}",
        )(child_changed)

    if op.webhook:
        admission.register(registry, op.trust_policy)
    return registry


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
    namespaces = op.namespace_list
    kopf.run(
        registry=build_registry(op),
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://0.0.0.0:{op.health_port}/healthz" if op.health_port else None,
    )

"""kopf registration: startup builds and starts the one Operator, cleanup stops it; the
admission webhook is registered beside them."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

import kopf

from dsv4_operator import event_loop
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.handlers import admission
from dsv4_operator.kube.errors import KubeError
from dsv4_operator.reconcile.dry_run import refused_children
from dsv4_operator.runtime.logs import configure_logging
from dsv4_operator.runtime.open_files import raise_open_files_limit
from dsv4_operator.runtime.webhook import webhook_server
from dsv4_operator.runtime.wiring import Operator, build_operator
from dsv4_operator.settings import OperatorSettings, unknown_settings

log = logging.getLogger(__name__)


def configure(settings: kopf.OperatorSettings, op: OperatorSettings) -> None:
    # No finalizer, progress or diff-base storage is configured: the operator registers only
    # event handlers (no on.create/update/delete, no kopf daemon or timer), for which kopf
    # never adds a finalizer nor stores handler progress or a last-handled state.
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING
    if op.webhook:
        settings.admission.server = webhook_server(op)
        if op.webhook_url_host:  # local: kopf keeps the ValidatingWebhookConfiguration
            settings.admission.managed = f"{op.prefix}.validation"


@dataclass
class _Started:
    """What startup made that the admission handler needs (it has no memo of its own)."""

    operator: Operator | None = None


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
        operator = build_operator(op, settings)
        memo.operator = started.operator = operator
        await operator.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        operator: Operator = memo.operator
        await operator.stop()

    if op.webhook:

        async def dry_run(name: str, namespace: str, spec: DSV4DeploymentSpec) -> list[str]:
            if started.operator is None:  # admission before startup finished: the rules alone
                raise KubeError(0, "NotStarted", "the operator's client is not ready yet")
            return await refused_children(started.operator.client, name, namespace, spec)

        admission.register(registry, op.trust_policy, dry_run)
    return registry


def run(op: OperatorSettings) -> None:
    """Start the operator and block until it stops."""
    configure_logging(op)
    for warning in unknown_settings(os.environ):
        log.warning(warning)
    raise_open_files_limit()
    namespaces = op.namespace_list
    # On uvloop, as `kopf run` does: the guard's reads and canaries are many small requests,
    # and asyncio's own loop and transports were a tenth of an idle operator's CPU. Ours
    # connects to pod IPs without uvloop's name lookups (event_loop.py).
    with asyncio.Runner(loop_factory=event_loop.new_event_loop) as runner:
        kopf.run(
            loop=runner.get_loop(),
            registry=build_registry(op),
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=op.liveness_endpoint,
        )

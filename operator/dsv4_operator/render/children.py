"""All children of one DSV4Deployment, in a fixed order with deterministic names."""

from __future__ import annotations

import dataclasses

from dsv4_operator.api.roles import ROLES, Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.names import (
    DEFAULT_OPERATOR_IMAGE,
    DEPLOYMENT_LABEL,
    FORMAT_LABEL,
    REVISION_LABEL,
    ROUTER,
    revision_name,
    service_monitor_name,
)
from dsv4_operator.render import engine, groups, router
from dsv4_operator.render.context import Manifest, OwnerRef, RenderContext, build_context
from dsv4_operator.render.weights import inline_model, model_context, render_weights
from dsv4_operator.series import engine_relabelings

TAP_METRICS = "tap-metrics"


def service_monitor(ctx: RenderContext) -> Manifest:
    """prometheus-operator ServiceMonitor: engines' /metrics on `http`, router's on `metrics`,
    the leak tap's on `tap-metrics`. Every series gets series.SCOPE: prometheus-operator sets
    `namespace` from the target, the engines' and the router's `deployment` (and `role`) come
    from their pods' labels (series.engine_relabelings); the tap exports both itself, so its
    labels are honoured (else Prometheus would add `exported_namespace` beside them)."""
    monitor = ctx.spec.monitoring.service_monitor
    meta = ctx.metadata(service_monitor_name(ctx.name))
    meta["labels"].update(monitor.labels)
    ports = ("http", "metrics", *((TAP_METRICS,) if router.tap_enabled(ctx) else ()))
    # The text as written (a manifest holds plain values: YAML dumpers refuse a str subclass).
    interval = str(monitor.interval)
    endpoints: list[Manifest] = [
        {"port": port, "path": "/metrics", "interval": interval}
        | ({"honorLabels": True} if port == TAP_METRICS else {"relabelings": engine_relabelings()})
        for port in ports
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {DEPLOYMENT_LABEL: ctx.name}},
            "endpoints": endpoints,
        },
    }


def workload(ctx: RenderContext, role: Role) -> Manifest:
    """A role's engines: a StatefulSet, or LeaderWorkerSet groups when a replica spans nodes."""
    if ctx.multi_node(role):
        return groups.leader_worker_set(ctx, role)
    return engine.statefulset(ctx, role)


def render_role(ctx: RenderContext, role: Role) -> list[Manifest]:
    """One engine role of ctx's pair: headless Service, workload, PodDisruptionBudget."""
    return [
        engine.headless_service(ctx, role),
        workload(ctx, role),
        engine.disruption_budget(ctx, role),
    ]


def render_router(ctx: RenderContext) -> list[Manifest]:
    """The router (targeting ctx's pair), its Service and PodDisruptionBudget."""
    return [
        router.service(ctx),
        router.deployment(ctx),
        engine.disruption_budget(ctx, ROUTER),
    ]


def render_shared(ctx: RenderContext) -> list[Manifest]:
    """Objects that are not per pair or router: the ServiceMonitor when enabled."""
    return [service_monitor(ctx)] if ctx.spec.monitoring.service_monitor.enabled else []


def controller_revision(ctx: RenderContext, number: int) -> Manifest:
    """The stored config of ctx's revision: the spec it was rendered from (for rollback)."""
    meta = ctx.metadata(revision_name(ctx.name, ctx.revision))
    meta["labels"][REVISION_LABEL] = ctx.revision
    meta["labels"][FORMAT_LABEL] = ctx.transfer_format
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": meta,
        "data": {
            "spec": ctx.spec.to_wire(),
            "revision": ctx.revision,
            "transferFormat": ctx.transfer_format,
        },
        "revision": number,
    }


def render(ctx: RenderContext) -> list[Manifest]:
    """Every child manifest: engines (decode first, the roll order), router, monitor."""
    out: list[Manifest] = []
    for role in reversed(ROLES):
        out += render_role(ctx, role)
    return out + render_router(ctx) + render_shared(ctx)


def render_spec(
    name: str,
    namespace: str,
    spec: DSV4DeploymentSpec,
    owner: OwnerRef | None = None,
    operator_image: str = DEFAULT_OPERATOR_IMAGE,
) -> list[Manifest]:
    """Convenience: build the context and render; with an inline Hub repo, also the DSV4Model
    the deployment creates and that model's claim, download Job and rights."""
    ctx = dataclasses.replace(
        build_context(name, namespace, spec, owner), operator_image=operator_image
    )
    model = inline_model(ctx)
    if model is None:
        return render(ctx)
    return [*render(ctx), model, *render_weights(model_context(model, "", operator_image))]

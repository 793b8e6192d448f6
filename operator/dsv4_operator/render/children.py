"""All children of one DSV4Deployment, in a fixed order with deterministic names."""

from __future__ import annotations

from dsv4_operator.api.spec import ROLES, DSV4DeploymentSpec, Role
from dsv4_operator.render import engine, router
from dsv4_operator.render.context import (
    LABEL_PREFIX,
    Manifest,
    OwnerRef,
    RenderContext,
    build_context,
)


def service_monitor(ctx: RenderContext) -> Manifest:
    """prometheus-operator ServiceMonitor: engines' /metrics on `http`, router's on `metrics`."""
    monitor = ctx.spec.monitoring.service_monitor
    meta = ctx.metadata(ctx.name)
    meta["labels"].update(monitor.labels)
    endpoints = [
        {"port": port, "path": "/metrics", "interval": monitor.interval}
        for port in ("http", "metrics")
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {f"{LABEL_PREFIX}/deployment": ctx.name}},
            "endpoints": endpoints,
        },
    }


def render_role(ctx: RenderContext, role: Role) -> list[Manifest]:
    """One engine role of ctx's pair: headless Service, StatefulSet, PodDisruptionBudget."""
    return [
        engine.headless_service(ctx, role),
        engine.statefulset(ctx, role),
        engine.disruption_budget(ctx, role),
    ]


def render_router(ctx: RenderContext) -> list[Manifest]:
    """The router (targeting ctx's pair), its Service and PodDisruptionBudget."""
    return [
        router.service(ctx),
        router.deployment(ctx),
        engine.disruption_budget(ctx, router.ROUTER),
    ]


def render_shared(ctx: RenderContext) -> list[Manifest]:
    """Objects that are not per pair or router: the ServiceMonitor when enabled."""
    return [service_monitor(ctx)] if ctx.spec.monitoring.service_monitor.enabled else []


def render(ctx: RenderContext) -> list[Manifest]:
    """Every child manifest: engines (decode first, the roll order), router, monitor."""
    out: list[Manifest] = []
    for role in reversed(ROLES):
        out += render_role(ctx, role)
    return out + render_router(ctx) + render_shared(ctx)


def render_spec(
    name: str, namespace: str, spec: DSV4DeploymentSpec, owner: OwnerRef | None = None
) -> list[Manifest]:
    """Convenience: build the context and render."""
    return render(build_context(name, namespace, spec, owner))

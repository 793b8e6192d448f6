"""All children of one DSV4Deployment, in a fixed order with deterministic names."""

from __future__ import annotations

from dsv4_operator.api.spec import ROLES, DSV4DeploymentSpec
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


def render(ctx: RenderContext) -> list[Manifest]:
    """Every child manifest: engines (decode first, the roll order), router, PDBs, monitor."""
    out: list[Manifest] = []
    for role in reversed(ROLES):
        out += [engine.headless_service(ctx, role), engine.statefulset(ctx, role)]
    out += [router.service(ctx), router.deployment(ctx)]
    out += [engine.disruption_budget(ctx, component) for component in (*ROLES, router.ROUTER)]
    if ctx.spec.monitoring.service_monitor.enabled:
        out.append(service_monitor(ctx))
    return out


def render_spec(
    name: str, namespace: str, spec: DSV4DeploymentSpec, owner: OwnerRef | None = None
) -> list[Manifest]:
    """Convenience: build the context and render."""
    return render(build_context(name, namespace, spec, owner))

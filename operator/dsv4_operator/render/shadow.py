"""A culprit search's shadow pair (pure): one probe configuration's prefill and decode, each a
StatefulSet with its own headless Service, and the pair's own router (Deployment and Service,
rendered as the serving router is), that nothing serving ever selects."""

from __future__ import annotations

from collections.abc import Mapping

from dsv4_operator.api.roles import ROLES
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.names import (
    DEPLOYMENT_LABEL,
    INSTANCE_LABEL,
    PROBE_LABEL,
    SHADOW_OF_LABEL,
    shadow_pair,
    shadow_router_name,
)
from dsv4_operator.render import engine, router
from dsv4_operator.render.context import Manifest, OwnerRef, RenderContext, build_context


def probe_spec(spec: DSV4DeploymentSpec) -> DSV4DeploymentSpec:
    """A probe configuration as a shadow pair runs it: one engine per role (the canary's
    concurrency is the production one, its capacity one replica's) and the operator managing
    replicas (an autoscaler never sees it)."""
    one = {"replicas": 1, "scaling": "Operator"}
    roles: dict[str, object] = {role: spec.role(role).model_copy(update=one) for role in ROLES}
    return spec.model_copy(
        update={**roles, "router": spec.router.model_copy(update={"replicas": 1})}
    )


def shadow_context(
    deployment: str,
    namespace: str,
    probe_id: str,
    spec: DSV4DeploymentSpec,
    owner: OwnerRef | None,
) -> RenderContext:
    """The render context of probe `probe_id`'s pair (names `<deployment>-<role>-b<probe>`)."""
    return build_context(
        deployment, namespace, probe_spec(spec), owner=owner, pair=shadow_pair(probe_id)
    )


def pair_gpus(ctx: RenderContext) -> int:
    """GPUs one shadow pair holds (one replica per role)."""
    return sum(ctx.gpus[role] for role in ROLES)


def _relabelled(labels: Mapping[str, str], deployment: str, probe_id: str) -> dict[str, str]:
    """Serving labels swapped for shadow ones: no DEPLOYMENT_LABEL (the router's targets, the
    Services, the ServiceMonitor, the guard's pod lists and the watch cache's children all
    select on it) and no instance label (a user's own selectors may use it)."""
    kept = {k: v for k, v in labels.items() if k not in (DEPLOYMENT_LABEL, INSTANCE_LABEL)}
    return {**kept, SHADOW_OF_LABEL: deployment, PROBE_LABEL: probe_id}


def _shadowed(manifest: Manifest, deployment: str, probe_id: str) -> Manifest:
    meta = manifest["metadata"]
    meta["labels"] = _relabelled(meta["labels"], deployment, probe_id)
    spec = manifest["spec"]
    if "selector" in spec and "matchLabels" in spec["selector"]:  # StatefulSet, Deployment
        selector = spec["selector"]["matchLabels"]
        spec["selector"]["matchLabels"] = _relabelled(selector, deployment, probe_id)
        template = spec["template"]["metadata"]
        template["labels"] = _relabelled(template["labels"], deployment, probe_id)
    elif "selector" in spec:  # Service
        spec["selector"] = _relabelled(spec["selector"], deployment, probe_id)
    return manifest


def render_shadow_pair(ctx: RenderContext, probe_id: str, priority_class: str) -> list[Manifest]:
    """The probe's prefill and decode (headless Service and StatefulSet each) and its router
    (Service and Deployment), owned by the DSV4Deployment (deleting it deletes them), their
    pods at `priority_class`."""
    manifests: list[Manifest] = []
    for role in ROLES:
        service = _shadowed(engine.headless_service(ctx, role), ctx.name, probe_id)
        statefulset = _shadowed(engine.statefulset(ctx, role), ctx.name, probe_id)
        statefulset["spec"]["template"]["spec"]["priorityClassName"] = priority_class
        manifests += [service, statefulset]
    return manifests + render_shadow_router(ctx, probe_id, priority_class)


def render_shadow_router(ctx: RenderContext, probe_id: str, priority_class: str) -> list[Manifest]:
    """The probe's router: the serving router's Deployment and Service (render/router.py) for
    `ctx`, whose engine URLs are the shadow pair's, under the probe's own name, without the
    leak tap (the search's canary classifies every reply itself, and a tap would count the
    probe's leaks as the deployment's)."""
    name = shadow_router_name(ctx.name, probe_id)
    service = _shadowed(router.service(ctx, tap=False), ctx.name, probe_id)
    deployment = _shadowed(router.deployment(ctx, tap=False), ctx.name, probe_id)
    service["metadata"]["name"] = deployment["metadata"]["name"] = name
    deployment["spec"]["template"]["spec"]["priorityClassName"] = priority_class
    return [service, deployment]


def shadow_selector(deployment: str, probe_id: str | None = None) -> dict[str, str]:
    """Selects the shadow objects of `deployment` (of one probe when given)."""
    selector = {SHADOW_OF_LABEL: deployment}
    if probe_id is not None:
        selector[PROBE_LABEL] = probe_id
    return selector

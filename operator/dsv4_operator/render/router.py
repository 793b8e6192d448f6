"""Builders for the PD router: Deployment and Service."""

from __future__ import annotations

from dsv4_operator.api.spec import ROUTER_METRICS_PORT
from dsv4_operator.names import FORMAT_LABEL, ROUTER, TARGET_PAIR_ANNOTATION
from dsv4_operator.render.context import Manifest, RenderContext, router_command
from dsv4_operator.render.pod_settings import with_pod_settings
from dsv4_operator.render.security import container_security, pod_security


def deployment(ctx: RenderContext) -> Manifest:
    """sgl-model-gateway with --pd-disaggregation, pointed at this revision's engines."""
    launch = router_command(ctx)
    # The format key (not the revision) is on the pods: a compatible change keeps the router.
    labels = {**ctx.labels(ROUTER), FORMAT_LABEL: ctx.transfer_format}
    meta = ctx.metadata(ctx.role_name(ROUTER), ROUTER)
    meta["annotations"] = {TARGET_PAIR_ANNOTATION: ctx.pair, FORMAT_LABEL: ctx.transfer_format}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": ctx.spec.router.replicas,
            "selector": {"matchLabels": ctx.selector(ROUTER)},
            "template": with_pod_settings(
                {
                    "metadata": {"labels": labels},
                    "spec": {
                        "enableServiceLinks": False,
                        **pod_security(),
                        "containers": [
                            {
                                "name": "router",
                                "image": ctx.spec.router.image or ctx.spec.engine.image,
                                "command": list(launch.command),
                                "ports": [
                                    {"name": "api", "containerPort": ctx.spec.router.port},
                                    {"name": "metrics", "containerPort": ROUTER_METRICS_PORT},
                                ],
                                "securityContext": container_security(),
                                "readinessProbe": {
                                    "httpGet": {"path": "/readiness", "port": "api"},
                                    "periodSeconds": 10,
                                },
                                "livenessProbe": {
                                    "httpGet": {"path": "/liveness", "port": "api"},
                                    "periodSeconds": 20,
                                },
                            }
                        ],
                    },
                },
                ctx.spec.pod_settings("router"),
            ),
        },
    }


def service(ctx: RenderContext) -> Manifest:
    """The OpenAI-compatible endpoint clients (and the canary) use."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.metadata(ctx.role_name(ROUTER), ROUTER),
        "spec": {
            "selector": ctx.selector(ROUTER),
            "ports": [
                {"name": "api", "port": ctx.spec.router.port, "targetPort": "api"},
                {"name": "metrics", "port": ROUTER_METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }

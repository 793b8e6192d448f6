"""Builders for the PD router: Deployment and Service."""

from __future__ import annotations

from dsv4_operator.api.limits import ROUTER_METRICS_PORT, TAP_METRICS_PORT, TAP_PORT
from dsv4_operator.names import FORMAT_LABEL, ROUTER, TARGET_PAIR_ANNOTATION
from dsv4_operator.render.context import Manifest, RenderContext, router_command
from dsv4_operator.render.pod_settings import with_pod_settings
from dsv4_operator.render.security import container_security, pod_security


def tap_default_resources(workers: int = 1) -> Manifest:
    """The tap's own work is light: per worker, a relay and one classifier process
    (bench/tap.py)."""
    return {
        "requests": {"cpu": f"{500 * workers}m", "memory": f"{256 * workers}Mi"},
        "limits": {"memory": f"{workers}Gi"},
    }


def tap_enabled(ctx: RenderContext) -> bool:
    return ctx.spec.guard.enabled and ctx.spec.guard.tap.enabled


def tap_container(ctx: RenderContext) -> Manifest:
    """The leak tap sidecar: in front of the router on TAP_PORT, its /metrics on
    TAP_METRICS_PORT; the operator's image (`dsv4 tap`)."""
    tap = ctx.spec.guard.tap
    return {
        "name": "tap",
        "image": ctx.operator_image,
        "args": [
            "tap",
            "--upstream",
            f"http://127.0.0.1:{ctx.spec.router.port}",
            "--listen",
            f"0.0.0.0:{TAP_PORT}",
            "--metrics",
            f"0.0.0.0:{TAP_METRICS_PORT}",
            "--deployment",
            ctx.name,
            "--namespace",
            ctx.namespace,
            # Only when asked for: the default renders the pod template it always has.
            *(["--workers", str(tap.workers)] if tap.workers > 1 else []),
        ],
        "ports": [
            {"name": "tap", "containerPort": TAP_PORT},
            {"name": "tap-metrics", "containerPort": TAP_METRICS_PORT},
        ],
        "securityContext": {
            **container_security(),
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
        },
        "resources": (
            {
                "requests": dict(sorted(tap.resources.requests.items())),
                "limits": dict(sorted(tap.resources.limits.items())),
            }
            if tap.resources is not None
            else tap_default_resources(tap.workers)
        ),
        # Ready when it serves; it forwards to the router, whose own probes gate the pod.
        "readinessProbe": {"tcpSocket": {"port": "tap"}, "periodSeconds": 10},
        "livenessProbe": {
            "httpGet": {"path": "/metrics", "port": "tap-metrics"},
            "periodSeconds": 20,
        },
        "volumeMounts": [{"name": "tap-tmp", "mountPath": "/tmp"}],
    }


def deployment(ctx: RenderContext, tap: bool | None = None) -> Manifest:
    """sgl-model-gateway with --pd-disaggregation, pointed at `ctx`'s pair of engines (the
    serving pair's, or a shadow pair's: render/shadow.py). `tap` False leaves the leak tap out
    (default: as the spec says)."""
    with_tap = tap_enabled(ctx) if tap is None else tap
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
                            },
                            *([tap_container(ctx)] if with_tap else []),
                        ],
                        **({"volumes": [{"name": "tap-tmp", "emptyDir": {}}]} if with_tap else {}),
                    },
                },
                ctx.spec.pod_settings("router"),
            ),
        },
    }


def service(ctx: RenderContext, tap: bool | None = None) -> Manifest:
    """The OpenAI-compatible endpoint clients (and the canary) use; `tap` as `deployment`'s."""
    with_tap = tap_enabled(ctx) if tap is None else tap
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.metadata(ctx.role_name(ROUTER), ROUTER),
        "spec": {
            "selector": ctx.selector(ROUTER),
            # With the tap, clients (and the canary) reach the router through it.
            "ports": [
                {
                    "name": "api",
                    "port": ctx.spec.router.port,
                    "targetPort": "tap" if with_tap else "api",
                },
                {"name": "metrics", "port": ROUTER_METRICS_PORT, "targetPort": "metrics"},
                *(
                    [{"name": "tap-metrics", "port": TAP_METRICS_PORT, "targetPort": "tap-metrics"}]
                    if with_tap
                    else []
                ),
            ],
        },
    }

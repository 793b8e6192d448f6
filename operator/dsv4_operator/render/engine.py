"""Builders for one engine role: StatefulSet, headless Service, PodDisruptionBudget.

A role whose replica spans nodes runs as LeaderWorkerSet groups instead (render/groups.py),
from the same pod template."""

from __future__ import annotations

from dsv4_operator.api.limits import ENGINE_PORT
from dsv4_operator.api.roles import Role
from dsv4_operator.engine.flags import MODEL_MOUNT
from dsv4_operator.names import (
    FORMAT_LABEL,
    MAX_TOTAL_TOKENS_ANNOTATION,
    PAIR_LABEL,
    REVISION_LABEL,
    SGLANG_VERSION_ANNOTATION,
    weights_claim_name,
)
from dsv4_operator.render.context import Manifest, RenderContext
from dsv4_operator.render.pod_settings import with_pod_settings
from dsv4_operator.render.security import container_security, pod_security

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
PROBE_PERIOD_SECONDS = 10
# Loading ~150 GiB of weights and capturing CUDA graphs takes 20-60 minutes; the startup probe
# allows 60 minutes before the kubelet restarts the container.
STARTUP_SECONDS = 60 * 60
# sglang's /health_generate gives up after SGLANG_HEALTH_CHECK_TIMEOUT = 20 s.
PROBE_TIMEOUT_SECONDS = 25
SHM_SIZE = "32Gi"


def _probe(path: str, period: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS,
        "failureThreshold": failures,
    }


def _volume(ctx: RenderContext) -> Manifest:
    cache = ctx.spec.model.cache
    if cache.pvc is not None:
        return {
            "name": "models",
            "persistentVolumeClaim": {
                "claimName": cache.pvc.claim_name,
                "readOnly": cache.pvc.read_only,
            },
        }
    if cache.model is not None or cache.hugging_face is not None:
        # The DSV4Model's claim: the referenced one, else the one named after the deployment.
        model = cache.model.name if cache.model is not None else ctx.name
        claim = {"claimName": weights_claim_name(model), "readOnly": True}
        return {"name": "models", "persistentVolumeClaim": claim}
    assert cache.host_path is not None  # schema: exactly one source
    return {"name": "models", "hostPath": {"path": cache.host_path.path, "type": "Directory"}}


def _resources(ctx: RenderContext, role: Role) -> Manifest:
    user = ctx.spec.role(role).resources
    gpus = ctx.gpus_per_pod(role)
    requests = {k: v for k, v in user.requests.items() if k != GPU_RESOURCE}
    limits = {k: v for k, v in user.limits.items() if k != GPU_RESOURCE}
    requests[GPU_RESOURCE] = gpus
    limits[GPU_RESOURCE] = gpus
    return {"requests": dict(sorted(requests.items())), "limits": dict(sorted(limits.items()))}


def pod_template(ctx: RenderContext, role: Role) -> Manifest:
    """The engine pod of one role (of a group: its leader), pinned to the GPU product."""
    role_spec = ctx.spec.role(role)
    launch = ctx.launches[role]
    ports: list[Manifest] = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    if role == "prefill":
        ports.append(
            {
                "name": "bootstrap",
                "containerPort": ctx.spec.transfer.bootstrap_port,
                "protocol": "TCP",
            }
        )
    read_only = ctx.spec.model.cache.pvc.read_only if ctx.spec.model.cache.pvc else True
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in role_spec.tolerations]
    tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    labels = {
        **ctx.labels(role),
        PAIR_LABEL: ctx.pair,
        REVISION_LABEL: ctx.revision,
        FORMAT_LABEL: ctx.transfer_format,
    }
    template: Manifest = {
        "metadata": {"labels": labels},
        "spec": {
            "nodeSelector": {**role_spec.node_selector, GPU_PRODUCT_LABEL: ctx.spec.gpu.product},
            "tolerations": tolerations,
            "enableServiceLinks": False,
            **pod_security(),
            "terminationGracePeriodSeconds": 120,
            "containers": [
                {
                    "name": "engine",
                    "image": ctx.spec.engine.image,
                    "command": list(launch.command),
                    "env": [{"name": k, "value": v} for k, v in launch.env],
                    "ports": ports,
                    "securityContext": container_security(),
                    # The kubelet copies the log tail of a failed container here: the guard
                    # reads CUDA OOM signatures from it (docs/engine-notes.md).
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "resources": _resources(ctx, role),
                    "volumeMounts": [
                        {"name": "models", "mountPath": MODEL_MOUNT, "readOnly": read_only},
                        {"name": "dshm", "mountPath": "/dev/shm"},
                    ],
                    "startupProbe": _probe(
                        "/health_generate",
                        PROBE_PERIOD_SECONDS,
                        STARTUP_SECONDS // PROBE_PERIOD_SECONDS,
                    ),
                    "readinessProbe": _probe("/health_generate", PROBE_PERIOD_SECONDS, 3),
                    # /health generates one token too; four misses (2 min) outlast a
                    # scheduler hiccup but not the 300 s watchdog (docs/engine-notes.md).
                    "livenessProbe": _probe("/health", 30, 4),
                }
            ],
            "volumes": [
                _volume(ctx),
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
            ],
        },
    }
    return with_pod_settings(template, ctx.spec.pod_settings(role))


def workload_metadata(ctx: RenderContext, role: Role) -> Manifest:
    """Metadata of a role's workload (StatefulSet or LeaderWorkerSet): its revision, transfer
    format, planned token budget and release, which the reconcile pass reads back."""
    meta = ctx.metadata(ctx.role_name(role), role)
    meta["labels"][REVISION_LABEL] = ctx.revision
    meta["annotations"] = {
        FORMAT_LABEL: ctx.transfer_format,
        MAX_TOTAL_TOKENS_ANNOTATION: str(ctx.plan.roles[role].max_total_tokens),
        SGLANG_VERSION_ANNOTATION: ctx.spec.engine.sglang_version,
    }
    return meta


def with_replicas(ctx: RenderContext, role: Role, spec: Manifest) -> Manifest:
    """`spec` with the role's replicas, unless an autoscaler owns them: then the field is
    not in the applied manifest, so the operator does not own it and an autoscaler's writes
    are never undone (a new workload starts at the default 1)."""
    if ctx.spec.role(role).scaling != "External":
        spec["replicas"] = ctx.spec.role(role).replicas
    return spec


def statefulset(ctx: RenderContext, role: Role) -> Manifest:
    """The engine pods of one role, pinned to GPU nodes of the requested product."""
    spec: Manifest = {
        "serviceName": ctx.role_name(role),
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": ctx.selector(role)},
        "template": pod_template(ctx, role),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": workload_metadata(ctx, role),
        "spec": with_replicas(ctx, role, spec),
    }


def headless_service(ctx: RenderContext, role: Role) -> Manifest:
    """Stable per-pod DNS for the router (prefill URLs carry the bootstrap port)."""
    ports: list[Manifest] = [
        {"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}
    ]
    if role == "prefill":
        port = ctx.spec.transfer.bootstrap_port
        ports.append(
            {"name": "bootstrap", "port": port, "targetPort": "bootstrap", "protocol": "TCP"}
        )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.metadata(ctx.role_name(role), role),
        "spec": {
            "clusterIP": "None",
            # The router waits for workers itself; DNS must resolve while they load.
            "publishNotReadyAddresses": True,
            "selector": ctx.service_selector(role),
            "ports": ports,
        },
    }


def disruption_budget(ctx: RenderContext, component: Role | str) -> Manifest:
    """At most one pod of a component down for voluntary disruptions (drains)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": ctx.metadata(ctx.role_name(component), component),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": ctx.selector(component)}},
    }

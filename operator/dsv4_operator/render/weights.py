"""Builders for weights from the Hugging Face Hub: the claim, the download Job and its rights.

The Job runs the operator's own image (`python -m dsv4_operator.weights`) with a service
account that may only read and annotate that one Job (its progress report). It is named by a
hash of what it downloads, since a Job's template cannot change: a new revision is a new Job
into the same claim.
"""

from __future__ import annotations

import hashlib
import json
import math

from dsv4_operator.api.model import HuggingFaceSource
from dsv4_operator.engine.flags import MODEL_MOUNT
from dsv4_operator.names import weights_claim_name, weights_job_name
from dsv4_operator.render.context import Manifest, RenderContext
from dsv4_operator.render.security import container_security
from dsv4_operator.weights.progress import PERMANENT_EXIT_CODES

WEIGHTS_COMPONENT = "weights"
# Headroom over the weights' size for the Hub's small files and a revision change's new blobs.
STORAGE_FACTOR = 1.2
# Pods retried after a transient failure (network, 5xx, a killed pod); each one resumes.
BACKOFF_LIMIT = 6
SOURCE_HASH_LENGTH = 10


def hub_source(ctx: RenderContext) -> HuggingFaceSource | None:
    return ctx.spec.model.cache.hugging_face


def source_hash(ctx: RenderContext, hub: HuggingFaceSource) -> str:
    """What the Job downloads and how: a change of any of these is a new Job."""
    key = {
        "repo": ctx.spec.model.name,
        "revision": hub.revision,
        "endpoint": hub.endpoint,
        "verify": hub.verify,
        "token": hub.token_secret.to_wire() if hub.token_secret else None,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return digest[:SOURCE_HASH_LENGTH]


def job_name(ctx: RenderContext) -> str | None:
    hub = hub_source(ctx)
    return weights_job_name(ctx.name, source_hash(ctx, hub)) if hub is not None else None


def storage(ctx: RenderContext, hub: HuggingFaceSource) -> str | int:
    if hub.storage is not None:
        return hub.storage
    return f"{math.ceil(ctx.plan.profiles.weights_gib * STORAGE_FACTOR)}Gi"


def claim(ctx: RenderContext, hub: HuggingFaceSource) -> Manifest:
    spec: Manifest = {
        "accessModes": list(hub.access_modes),
        "resources": {"requests": {"storage": storage(ctx, hub)}},
    }
    if hub.storage_class_name:
        spec["storageClassName"] = hub.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": ctx.metadata(weights_claim_name(ctx.name), WEIGHTS_COMPONENT),
        "spec": spec,
    }


def service_account(ctx: RenderContext) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": ctx.metadata(weights_claim_name(ctx.name), WEIGHTS_COMPONENT),
        "automountServiceAccountToken": False,
    }


def role(ctx: RenderContext, job: str) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": ctx.metadata(weights_claim_name(ctx.name), WEIGHTS_COMPONENT),
        "rules": [
            {
                "apiGroups": ["batch"],
                "resources": ["jobs"],
                "resourceNames": [job],
                "verbs": ["get", "patch"],
            }
        ],
    }


def role_binding(ctx: RenderContext) -> Manifest:
    name = weights_claim_name(ctx.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": ctx.metadata(name, WEIGHTS_COMPONENT),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
    }


def _env(ctx: RenderContext, hub: HuggingFaceSource, job: str) -> list[Manifest]:
    env: list[Manifest] = [
        {"name": "DSV4_WEIGHTS_REPO", "value": ctx.spec.model.name},
        {"name": "DSV4_WEIGHTS_REVISION", "value": hub.revision},
        {"name": "DSV4_WEIGHTS_VERIFY", "value": hub.verify},
        {"name": "DSV4_WEIGHTS_JOB", "value": job},
        {
            "name": "DSV4_WEIGHTS_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": "HF_HOME", "value": MODEL_MOUNT},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        {"name": "HF_HUB_DISABLE_PROGRESS_BARS", "value": "1"},
    ]
    if hub.endpoint:
        env.append({"name": "HF_ENDPOINT", "value": hub.endpoint})
    if hub.token_secret is not None:
        ref = {"name": hub.token_secret.name, "key": hub.token_secret.key}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env


def job(ctx: RenderContext, hub: HuggingFaceSource) -> Manifest:
    name = weights_job_name(ctx.name, source_hash(ctx, hub))
    labels = ctx.labels(WEIGHTS_COMPONENT)
    pod_spec: Manifest = {
        "serviceAccountName": weights_claim_name(ctx.name),
        # The one pod of the deployment that talks to the API server: its own Job only.
        "automountServiceAccountToken": True,
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "securityContext": {
            "seccompProfile": {"type": "RuntimeDefault"},
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "fsGroup": 65532,
        },
        "containers": [
            {
                "name": "download",
                "image": ctx.operator_image,
                "command": ["python", "-m", "dsv4_operator.weights"],
                "env": _env(ctx, hub, name),
                "securityContext": {
                    **container_security(),
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": True,
                },
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "limits": {"memory": "4Gi"},
                },
                "volumeMounts": [
                    {"name": "models", "mountPath": MODEL_MOUNT},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }
        ],
        "volumes": [
            {
                "name": "models",
                "persistentVolumeClaim": {"claimName": weights_claim_name(ctx.name)},
            },
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    pull = ctx.spec.pod_template.image_pull_secrets
    if pull:
        pod_spec["imagePullSecrets"] = [s.to_wire() for s in pull]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": ctx.metadata(name, WEIGHTS_COMPONENT),
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            # Exit codes no retry can fix (401, 404, disk full, checksum): fail at once.
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "download",
                            "operator": "In",
                            "values": list(PERMANENT_EXIT_CODES),
                        },
                    },
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]
            },
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def render_weights(ctx: RenderContext) -> list[Manifest]:
    """The claim, the Job's rights and the Job; nothing when the weights are not from the Hub."""
    hub = hub_source(ctx)
    if hub is None:
        return []
    name = weights_job_name(ctx.name, source_hash(ctx, hub))
    return [
        claim(ctx, hub),
        service_account(ctx),
        role(ctx, name),
        role_binding(ctx),
        job(ctx, hub),
    ]

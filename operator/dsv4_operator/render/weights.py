"""Builders for a DSV4Model's weights from the Hugging Face Hub: the claim, the download Job
and its rights; and the DSV4Model a deployment naming a Hub repo inline creates.

The Job runs the operator's own image (`python -m dsv4_operator.weights`) with a service
account that may only read and annotate that one Job (its progress report). It is named by a
hash of what it downloads, since a Job's template cannot change: a new revision is a new Job
into the same claim. Everything here is owned by the DSV4Model (garbage collected with it,
never with a deployment).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from dsv4_operator.api.models import DSV4ModelSpec
from dsv4_operator.engine.flags import MODEL_MOUNT
from dsv4_operator.names import (
    API_VERSION,
    APP_NAME,
    COMPONENT_LABEL,
    CREATED_FOR_LABEL,
    INSTANCE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MODEL_KIND,
    MODEL_LABEL,
    NAME_LABEL,
    ROLE_LABEL,
    weights_claim_name,
    weights_job_name,
)
from dsv4_operator.render.context import Manifest, RenderContext
from dsv4_operator.render.security import container_security
from dsv4_operator.weights.progress import PERMANENT_EXIT_CODES

WEIGHTS_COMPONENT = "weights"
# Headroom over the weights' size for the Hub's small files and a revision change's new blobs.
STORAGE_FACTOR = 1.2
# Pods retried after a transient failure (network, 5xx, a killed pod); each one resumes.
BACKOFF_LIMIT = 6
SOURCE_HASH_LENGTH = 10


@dataclass(frozen=True)
class ModelContext:
    """One DSV4Model: what its children are rendered from."""

    name: str
    namespace: str
    uid: str
    spec: DSV4ModelSpec
    operator_image: str

    def labels(self) -> dict[str, str]:
        return {
            NAME_LABEL: APP_NAME,
            INSTANCE_LABEL: self.name,
            MANAGED_BY_LABEL: MANAGED_BY,
            MODEL_LABEL: self.name,
            COMPONENT_LABEL: WEIGHTS_COMPONENT,
            ROLE_LABEL: WEIGHTS_COMPONENT,
        }

    def metadata(self, name: str) -> Manifest:
        meta: Manifest = {"name": name, "namespace": self.namespace, "labels": self.labels()}
        if not self.uid:  # rendered without a stored model (`dsv4 render`, a dry run)
            return meta
        owner = {
            "apiVersion": API_VERSION,
            "kind": MODEL_KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        return {**meta, "ownerReferences": [owner]}


def inline_model(ctx: RenderContext) -> Manifest | None:
    """The DSV4Model a deployment naming a Hub repo inline (spec.model.cache.huggingFace)
    creates or adopts: named after the deployment, its spec the deployment's fields, owned by
    nobody (deleting the deployment keeps it and its weights)."""
    hub = ctx.spec.model.cache.hugging_face
    if hub is None or ctx.spec.model.cache.model is not None:  # a reference, resolved
        return None
    spec = DSV4ModelSpec.model_validate(
        {
            **hub.model_dump(exclude={"storage"}),
            "repo": ctx.spec.model.name,
            "checkpoint": ctx.spec.model.checkpoint,
            "storage": storage(ctx),
            "image_pull_secrets": ctx.spec.pod_template.image_pull_secrets,
        }
    )
    return {
        "apiVersion": API_VERSION,
        "kind": MODEL_KIND,
        "metadata": {
            "name": ctx.name,
            "namespace": ctx.namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, CREATED_FOR_LABEL: ctx.name},
        },
        "spec": spec.to_wire(),
    }


def model_context(model: Manifest, uid: str, operator_image: str) -> ModelContext:
    """The context of a DSV4Model manifest (its spec already valid)."""
    meta = model["metadata"]
    spec = DSV4ModelSpec.model_validate(model["spec"])
    return ModelContext(meta["name"], meta["namespace"], uid, spec, operator_image)


def storage(ctx: RenderContext) -> str | int:
    """The inline source's claim size: as given, else 1.2 x the profile's weights."""
    hub = ctx.spec.model.cache.hugging_face
    if hub is not None and hub.storage is not None:
        return hub.storage
    return f"{math.ceil(ctx.plan.profiles.weights_gib * STORAGE_FACTOR)}Gi"


def source_hash(ctx: ModelContext) -> str:
    """What the Job downloads and how: a change of any of these is a new Job. `owner`: a Job
    of a DSV4Model is never one a deployment owned before models (its template differs and
    cannot change); that Job's download is found on the claim and only verified."""
    hub = ctx.spec
    key = {
        "owner": MODEL_KIND,
        "repo": hub.repo,
        "revision": hub.revision,
        "endpoint": hub.endpoint,
        "verify": hub.verify,
        "token": hub.token_secret.to_wire() if hub.token_secret else None,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return digest[:SOURCE_HASH_LENGTH]


def job_name(ctx: ModelContext) -> str:
    return weights_job_name(ctx.name, source_hash(ctx))


def claim(ctx: ModelContext) -> Manifest:
    hub = ctx.spec
    spec: Manifest = {
        "accessModes": list(hub.access_modes),
        "resources": {"requests": {"storage": hub.storage}},
    }
    if hub.storage_class_name:
        spec["storageClassName"] = hub.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": ctx.metadata(weights_claim_name(ctx.name)),
        "spec": spec,
    }


def service_account(ctx: ModelContext) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": ctx.metadata(weights_claim_name(ctx.name)),
        "automountServiceAccountToken": False,
    }


def role(ctx: ModelContext, job: str) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": ctx.metadata(weights_claim_name(ctx.name)),
        "rules": [
            {
                "apiGroups": ["batch"],
                "resources": ["jobs"],
                "resourceNames": [job],
                "verbs": ["get", "patch"],
            }
        ],
    }


def role_binding(ctx: ModelContext) -> Manifest:
    name = weights_claim_name(ctx.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": ctx.metadata(name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
    }


def _env(ctx: ModelContext, job: str) -> list[Manifest]:
    hub = ctx.spec
    env: list[Manifest] = [
        {"name": "DSV4_WEIGHTS_REPO", "value": ctx.spec.repo},
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


def job(ctx: ModelContext) -> Manifest:
    name = job_name(ctx)
    labels = ctx.labels()
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
                "env": _env(ctx, name),
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
    pull = ctx.spec.image_pull_secrets
    if pull:
        pod_spec["imagePullSecrets"] = [s.to_wire() for s in pull]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": ctx.metadata(name),
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


def render_weights(ctx: ModelContext) -> list[Manifest]:
    """The claim, the Job's rights and the Job."""
    return [claim(ctx), service_account(ctx), role(ctx, job_name(ctx)), role_binding(ctx), job(ctx)]

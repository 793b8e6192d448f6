"""The API types the operator touches, and their REST paths."""

from __future__ import annotations

from dataclasses import dataclass

from dsv4_operator.names import (
    API_VERSION,
    KIND,
    LWS_API_VERSION,
    LWS_KIND,
    MODEL_KIND,
    MODEL_PLURAL,
    PLURAL,
)


@dataclass(frozen=True)
class Resource:
    """One API type: where it lives in the REST tree."""

    api_version: str
    kind: str
    plural: str

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = (
            f"/api/{self.api_version}"
            if "/" not in self.api_version
            else f"/apis/{self.api_version}"
        )
        if namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name is not None else base


DSV4 = Resource(API_VERSION, KIND, PLURAL)
DSV4_MODEL = Resource(API_VERSION, MODEL_KIND, MODEL_PLURAL)
STATEFULSET = Resource("apps/v1", "StatefulSet", "statefulsets")
DEPLOYMENT = Resource("apps/v1", "Deployment", "deployments")
# A multi-node role's groups (render/groups.py); served only where LWS is installed.
LEADER_WORKER_SET = Resource(LWS_API_VERSION, LWS_KIND, "leaderworkersets")
# The kinds an engine role runs as, by kind.
WORKLOADS = {r.kind: r for r in (STATEFULSET, LEADER_WORKER_SET)}
CONTROLLER_REVISION = Resource("apps/v1", "ControllerRevision", "controllerrevisions")
SERVICE = Resource("v1", "Service", "services")
POD = Resource("v1", "Pod", "pods")
EVENT = Resource("v1", "Event", "events")
PDB = Resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
SERVICE_MONITOR = Resource("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors")
LEASE = Resource("coordination.k8s.io/v1", "Lease", "leases")
# Weights from the Hugging Face Hub: the claim, the download Job and the Job's own rights.
JOB = Resource("batch/v1", "Job", "jobs")
# Read by name for its existence only (metadata, KubeClient.exists), never listed or watched.
SECRET = Resource("v1", "Secret", "secrets")
PVC = Resource("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
SERVICE_ACCOUNT = Resource("v1", "ServiceAccount", "serviceaccounts")
RBAC_ROLE = Resource("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLE_BINDING = Resource("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
WEIGHTS_KINDS = (PVC, SERVICE_ACCOUNT, RBAC_ROLE, ROLE_BINDING, JOB)

BY_KIND: dict[tuple[str, str], Resource] = {
    (r.api_version, r.kind): r
    for r in (
        DSV4,
        DSV4_MODEL,
        STATEFULSET,
        LEADER_WORKER_SET,
        DEPLOYMENT,
        CONTROLLER_REVISION,
        SERVICE,
        POD,
        EVENT,
        PDB,
        SERVICE_MONITOR,
        LEASE,
        *WEIGHTS_KINDS,
    )
}


def resource_of(obj: dict[str, object]) -> Resource:
    return BY_KIND[(str(obj["apiVersion"]), str(obj["kind"]))]

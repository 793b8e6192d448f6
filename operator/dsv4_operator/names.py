"""Every name the operator shares with the cluster, in one place.

The API group, version and kind; the label and annotation keys on children; the names of the
children themselves; the RFC 3339 time stamps of status and events. Modules import these
rather than spell them (kubebuilder's `groupversion_info.go`, cert-manager's `constants.go`).
"""

from __future__ import annotations

import re
from datetime import datetime

# The custom resource.
GROUP = "dsv4.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DSV4Deployment"
PLURAL = "dsv4deployments"
SINGULAR = "dsv4deployment"
SHORT_NAMES = ("dsv4",)
# The model a deployment serves, an object of its own (docs/models.md): its Hub download,
# claim and progress outlive any deployment that uses it.
MODEL_KIND = "DSV4Model"
MODEL_PLURAL = "dsv4models"
MODEL_SINGULAR = "dsv4model"
MODEL_SHORT_NAMES = ("dsv4model",)

# Who we are: the managed-by label value, the Event reporter, the server-side apply manager.
OPERATOR = "dsv4-operator"
MANAGED_BY = OPERATOR

# Well-known Kubernetes labels.
APP_NAME = "dsv4"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "app.kubernetes.io/component"

# Our labels (and annotations) on children, under the API group.
LABEL_PREFIX = GROUP
DEPLOYMENT_LABEL = f"{LABEL_PREFIX}/deployment"
ROLE_LABEL = f"{LABEL_PREFIX}/role"
PAIR_LABEL = f"{LABEL_PREFIX}/pair"
# On a DSV4Model's children (claim, download Job, its rights): the model they belong to.
MODEL_LABEL = f"{LABEL_PREFIX}/model"
# On a DSV4Model a deployment created from its inline Hub repo: that deployment's name.
CREATED_FOR_LABEL = f"{LABEL_PREFIX}/created-for"
# Held on a DSV4Model while a deployment references it: deleting it waits for them.
MODEL_FINALIZER = f"{GROUP}/model-in-use"
# The work queue's key of a DSV4Model: (namespace, MODEL_KEY_PREFIX + name). An object name
# never holds '/', so it never meets a DSV4Deployment's key.
MODEL_KEY_PREFIX = f"{MODEL_KIND}/"
REVISION_LABEL = f"{LABEL_PREFIX}/revision"
# The P/D transfer-format key: a label on pods and ControllerRevisions, an annotation on
# StatefulSets and the router Deployment.
FORMAT_LABEL = f"{LABEL_PREFIX}/transfer-format"
MAX_TOTAL_TOKENS_ANNOTATION = f"{LABEL_PREFIX}/max-total-tokens"
# On engine StatefulSets: the SGLang release the image carries (spec.engine.sglangVersion, the
# image's label of the same name); the engine test double reads it to answer as that release.
SGLANG_VERSION_ANNOTATION = f"{LABEL_PREFIX}/sglang-version"
# On the router Deployment: the prefill/decode pair its arguments target.
TARGET_PAIR_ANNOTATION = f"{LABEL_PREFIX}/target-pair"
# On every applied child: the hash of the content the operator applied (no-op detection).
APPLIED_ANNOTATION = f"{LABEL_PREFIX}/applied-hash"
# Set by a user on the DSV4Deployment to release a quarantined config hash.
CLEAR_QUARANTINE_ANNOTATION = f"{LABEL_PREFIX}/clear-quarantine"
# On a culprit search's shadow pairs (docs/bisect.md), instead of DEPLOYMENT_LABEL: the
# deployment they probe for and the probe. Nothing that selects serving objects (the router,
# the engine Services, the ServiceMonitor, the guard's pod lists, the watch cache's children)
# selects these.
SHADOW_OF_LABEL = f"{LABEL_PREFIX}/shadow-of"
PROBE_LABEL = f"{LABEL_PREFIX}/probe"
# The PriorityClass the chart ships for shadow pairs (lower than serving, never preempting).
DEFAULT_BISECT_PRIORITY_CLASS = "dsv4-bisect"
# A probe id: the pair suffix of its shadow objects, so it fits REVISION_HASH_LENGTH.
PROBE_ID_PATTERN = r"^[a-z0-9]{1,9}$"
# On the canary's own requests: the leak tap leaves them out of the production traffic it
# classifies (the canary counts its samples itself).
PROBE_HEADER = {"X-DSV4-Probe": "1"}

# LeaderWorkerSet (sigs.k8s.io/lws v0.9.0, api/leaderworkerset/v1): a multi-node role's groups.
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_PREFIX = "leaderworkerset.sigs.k8s.io"
LWS_NAME_LABEL = f"{LWS_PREFIX}/name"
LWS_GROUP_INDEX_LABEL = f"{LWS_PREFIX}/group-index"
LWS_WORKER_INDEX_LABEL = f"{LWS_PREFIX}/worker-index"  # "0" on a group's leader
# On a LeaderWorkerSet: the node label key whose value every pod of a group shares, one group
# per value (lws pkg/webhooks/pod_webhook.go, SetExclusiveAffinities).
LWS_EXCLUSIVE_TOPOLOGY_ANNOTATION = f"{LWS_PREFIX}/exclusive-topology"
# The environment the LWS pod webhook injects into every container of a group.
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE_ENV = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX_ENV = "LWS_WORKER_INDEX"

# Components and pairs.
ROUTER = "router"
ENGINE_COMPONENTS = ("prefill", "decode")
# The pair with plain names; a BlueGreen pair is named by its revision hash.
MAIN_PAIR = "main"
# Hex digits of a revision hash (revision names, BlueGreen pair suffixes).
REVISION_HASH_LENGTH = 10

# Object names. Children are Services (DNS-1035 labels: no dots, a letter first) and
# StatefulSets, whose pods carry `controller-revision-hash: <statefulset>-<10 chars>`, a label
# value of at most 63 characters: a StatefulSet name may have 52. The longest child is a
# BlueGreen pair's prefill StatefulSet, `<name>-prefill-<hash>`, which bounds the object's name.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
STATEFULSET_NAME_LIMIT = 52
MAX_DEPLOYMENT_NAME_LENGTH = (
    STATEFULSET_NAME_LIMIT - len(f"-{max(ENGINE_COMPONENTS, key=len)}-") - REVISION_HASH_LENGTH
)
# A multi-node role's LeaderWorkerSet has its StatefulSet's name, and the LWS controller makes
# one worker StatefulSet per group, `<lws>-<group index>` (lws pkg/controllers/pod_controller.go,
# constructWorkerStatefulSetApplyConfiguration), whose pods carry the same 63-character
# controller-revision-hash label; worker pods are `<lws>-<group>-<worker>` (63-character
# hostnames). The index of the last of api/limits.py's MAX_ROLE_REPLICAS (128) groups bounds a
# multi-node deployment's name further (here as a number: api/ imports this module).
MAX_GROUP_INDEX = 127
MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH = MAX_DEPLOYMENT_NAME_LENGTH - len(f"-{MAX_GROUP_INDEX}")


def child_name(deployment: str, component: str, pair: str = MAIN_PAIR) -> str:
    """Engine objects (StatefulSet, headless Service, PDB) of a pair, or the router's.

    The main pair and the router have plain names; another pair's engines carry its suffix.
    """
    if pair == MAIN_PAIR or component == ROUTER:
        return f"{deployment}-{component}"
    return f"{deployment}-{component}-{pair}"


def shadow_pair(probe_id: str) -> str:
    """The pair suffix of a probe's shadow objects: `<deployment>-<role>-b<probe>`, never a
    serving pair's (those are `main` or a 10-hex revision hash)."""
    if not re.fullmatch(PROBE_ID_PATTERN, probe_id):
        raise ValueError(f"a probe id is 1 to 9 of [a-z0-9], got {probe_id!r}")
    return f"b{probe_id}"


def shadow_router_name(deployment: str, probe_id: str) -> str:
    """A probe's own router (Deployment and Service): `<deployment>-router-b<probe>`."""
    return f"{router_name(deployment)}-{shadow_pair(probe_id)}"


def shadow_router_url(deployment: str, namespace: str, probe_id: str, port: int) -> str:
    """The in-cluster URL of a probe's router Service: the culprit search's canary target."""
    return f"http://{shadow_router_name(deployment, probe_id)}.{namespace}.svc:{port}"


def longest_child_name(deployment: str) -> str:
    """The longest name derived from `deployment` (a BlueGreen pair's prefill StatefulSet)."""
    return child_name(deployment, max(ENGINE_COMPONENTS, key=len), "0" * REVISION_HASH_LENGTH)


def longest_group_child_name(deployment: str) -> str:
    """The longest name derived from a multi-node `deployment`: the worker StatefulSet of the
    last group of a BlueGreen pair's prefill LeaderWorkerSet."""
    return f"{longest_child_name(deployment)}-{MAX_GROUP_INDEX}"


def router_name(deployment: str) -> str:
    """The router Deployment, Service and PodDisruptionBudget (one per deployment)."""
    return child_name(deployment, ROUTER)


def router_url(deployment: str, namespace: str, port: int) -> str:
    """The in-cluster URL of the router Service."""
    return f"http://{router_name(deployment)}.{namespace}.svc:{port}"


def service_monitor_name(deployment: str) -> str:
    return deployment


#: The operator's own image, which also runs the weights download Job and the leak tap
#: (DSV4_OPERATOR_IMAGE; the chart sets it to the image it deploys).
DEFAULT_OPERATOR_IMAGE = "registry.example.com/dsv4-operator:0.1.0"


def weights_claim_name(model: str) -> str:
    """The PVC of a DSV4Model's weights downloaded from the Hugging Face Hub (a deployment
    naming its repo inline uses the model of its own name: `<deployment>-weights`)."""
    return f"{model}-weights"


def weights_job_name(model: str, source_hash: str) -> str:
    """The download Job of one (repo, revision, endpoint): Job templates are immutable."""
    return f"{model}-weights-{source_hash}"


def revision_name(deployment: str, revision: str) -> str:
    """The ControllerRevision that stores the config of `revision`."""
    return f"{deployment}-{revision}"


# RFC 3339 in UTC with second precision, as metav1.Time serializes.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(at: datetime) -> str:
    return at.strftime(TIME_FORMAT)


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 time as the API server writes it (`Z` suffix); None for none."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))

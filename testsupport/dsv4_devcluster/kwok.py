"""kwok configuration for the dev cluster: which Nodes it manages, the Stages that play kubelet.

kwok (v0.8) needs its lifecycle Stages in its config file. Ours are deliberately few:

* ``devcluster-node-ready``: a new managed Node (no conditions yet) becomes Running/Ready with
  no pressure conditions; its capacity/allocatable (set by :mod:`.nodes`) are left alone,
  since kwok applies status templates as strategic-merge patches.
* ``devcluster-node-heartbeat``: refreshes the Ready condition now and then; liveness for the
  node lifecycle controller comes from kwok's node Leases (``nodeLeaseDurationSeconds``).
* ``devcluster-pod-ready``: a pod bound to a managed node, without a pod IP yet and without
  the :data:`~.kubelet.MANUAL_STATUS_ANNOTATION`, becomes Running with every container
  running and ready. After that kwok leaves the pod's status alone, which is what lets a
  test write kubelet-style reports (:func:`~.kubelet.report_container_terminated`).
* ``devcluster-pod-delete``: a pod being deleted loses its finalizers and is removed, as a
  kubelet would confirm (otherwise pods would stay Terminating forever); except a pod
  annotated :data:`~.kubelet.HELD_TERMINATION_ANNOTATION` (:func:`~.kubelet.hold_termination`),
  which stays Terminating until the test removes it: a real kubelet takes its grace period,
  kwok takes milliseconds, and a controller reacting to a terminating pod (LWS restarting a
  group) must be able to see it.
"""

from __future__ import annotations

from typing import Any

import yaml

from dsv4_devcluster.kubelet import HELD_TERMINATION_ANNOTATION, MANUAL_STATUS_ANNOTATION

NODE_ANNOTATION = "kwok.x-k8s.io/node"
POD_CIDR = "10.244.0.0/16"
NODE_LEASE_SECONDS = 40

_STAGE_API = "kwok.x-k8s.io/v1alpha1"

_NODE_CONDITIONS_FALSE = (
    ("MemoryPressure", "KubeletHasSufficientMemory"),
    ("DiskPressure", "KubeletHasNoDiskPressure"),
    ("PIDPressure", "KubeletHasSufficientPID"),
    ("NetworkUnavailable", "RouteCreated"),
)


def _stage(
    name: str,
    kind: str,
    expressions: list[dict[str, Any]],
    nxt: dict[str, Any],
    delay_ms: tuple[int, int] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": expressions},
        "next": nxt,
    }
    if delay_ms is not None:
        spec["delay"] = {
            "durationMilliseconds": delay_ms[0],
            "jitterDurationMilliseconds": delay_ms[1],
        }
    return {"apiVersion": _STAGE_API, "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def _node_ready_template() -> str:
    lines = [
        "{{ $now := Now }}",
        "phase: Running",
        "conditions:",
        "- type: Ready",
        '  status: "True"',
        "  reason: KubeletReady",
        "  message: kwok is posting ready status",
        "  lastHeartbeatTime: {{ $now | Quote }}",
        "  lastTransitionTime: {{ $now | Quote }}",
    ]
    for cond, reason in _NODE_CONDITIONS_FALSE:
        lines += [
            f"- type: {cond}",
            '  status: "False"',
            f"  reason: {reason}",
            "  lastHeartbeatTime: {{ $now | Quote }}",
            "  lastTransitionTime: {{ $now | Quote }}",
        ]
    lines += [
        "addresses:",
        "- type: InternalIP",
        "  address: {{ NodeIP | Quote }}",
        "- type: Hostname",
        "  address: {{ .metadata.name | Quote }}",
    ]
    return "\n".join(lines) + "\n"


_NODE_HEARTBEAT_TEMPLATE = """\
{{ $now := Now }}
conditions:
- type: Ready
  status: "True"
  reason: KubeletReady
  message: kwok is posting ready status
  lastHeartbeatTime: {{ $now | Quote }}
"""

_POD_READY_TEMPLATE = """\
{{ $now := Now }}
phase: Running
startTime: {{ $now | Quote }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIP | Quote }}
conditions:
- type: PodReadyToStartContainers
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Initialized
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  imageID: {{ .image | Quote }}
  containerID: {{ printf "kwok://%s" .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
"""


def stages() -> list[dict[str, Any]]:
    """The Stage objects described in the module docstring."""
    manual_key = MANUAL_STATUS_ANNOTATION[0]
    held_key = HELD_TERMINATION_ANNOTATION[0]
    return [
        _stage(
            "devcluster-node-ready",
            "Node",
            [{"key": ".status.conditions", "operator": "DoesNotExist"}],
            {"statusTemplate": _node_ready_template()},
        ),
        _stage(
            "devcluster-node-heartbeat",
            "Node",
            [{"key": ".status.phase", "operator": "In", "values": ["Running"]}],
            {"statusTemplate": _NODE_HEARTBEAT_TEMPLATE},
            delay_ms=(20_000, 30_000),
        ),
        _stage(
            "devcluster-pod-ready",
            "Pod",
            [
                {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                {"key": ".status.podIP", "operator": "DoesNotExist"},
                {"key": f'.metadata.annotations["{manual_key}"]', "operator": "DoesNotExist"},
            ],
            {"statusTemplate": _POD_READY_TEMPLATE},
        ),
        _stage(
            "devcluster-pod-delete",
            "Pod",
            [
                {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                {"key": f'.metadata.annotations["{held_key}"]', "operator": "DoesNotExist"},
            ],
            {"finalizers": {"empty": True}, "delete": True},
        ),
    ]


def config_yaml(server_address: str) -> str:
    """kwok's ``--config`` file: a KwokConfiguration followed by :func:`stages`."""
    kwok_config = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": f"{NODE_ANNOTATION}=fake",
            "cidr": POD_CIDR,
            "nodeIP": "10.96.0.2",
            "serverAddress": server_address,
            "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
            # kwok applies no defaults to a KwokConfiguration read from a file: spell them out.
            "podPlayStageParallelism": 2,
            "nodePlayStageParallelism": 2,
            "nodeLeaseParallelism": 2,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
            "enableDebuggingHandlers": False,
            "enableProfilingHandler": False,
            "enableContentionProfiling": False,
        },
    }
    return yaml.safe_dump_all([kwok_config, *stages()], sort_keys=False)

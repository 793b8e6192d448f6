"""Kubelet-shaped pod status reports for kwok pods: drive a container to OOMKilled and the like.

kwok plays the kubelet for fake nodes: it moves a scheduled pod to Running/Ready once (see
:mod:`.kwok`) and then leaves its status alone. To make a container fail the way a real
kubelet would report it, write the pod's ``/status`` subresource with
:func:`report_container_terminated`. It also annotates the pod with
:data:`MANUAL_STATUS_ANNOTATION`, which keeps kwok's pod-ready stage off it for good; then it
writes what a kubelet writes after a container was killed: the container's
``lastState.terminated`` (reason, exit code), its ``state`` (``waiting: CrashLoopBackOff`` if
it restarts, else ``terminated``), ``restartCount`` + 1, ``ready: false``, and the pod's
Ready/ContainersReady conditions False.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

#: Pods annotated key=value are never made Running/Ready by the harness's kwok stages.
MANUAL_STATUS_ANNOTATION = ("devcluster.dsv4.io/status", "manual")

MERGE_PATCH = "application/merge-patch+json"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_pod_running(dyn: Any, namespace: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
    """Wait until kwok reported the pod Running with a pod IP; return it as a dict."""
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    deadline = time.monotonic() + timeout
    while True:
        pod: dict[str, Any] = pods.get(name=name, namespace=namespace).to_dict()
        status = pod.get("status") or {}
        if status.get("phase") == "Running" and status.get("podIP"):
            return pod
        if time.monotonic() > deadline:
            raise TimeoutError(f"pod {namespace}/{name} not Running after {timeout}s: {status}")
        time.sleep(0.25)


def report_container_terminated(
    dyn: Any,
    namespace: str,
    name: str,
    container: str,
    *,
    reason: str = "OOMKilled",
    exit_code: int = 137,
    restarting: bool = True,
    message: str = "",
) -> dict[str, Any]:
    """Report ``container`` of pod ``namespace/name`` as killed; return the updated pod.

    ``restarting=True`` (restartPolicy Always, the common case) reports what a kubelet
    shows after the restart back-off started: ``state.waiting.reason=CrashLoopBackOff``
    and the kill in ``lastState``. ``restarting=False`` leaves the container in
    ``state.terminated``. The pod should already be Running (see :func:`wait_pod_running`).
    """
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    key, value = MANUAL_STATUS_ANNOTATION
    pods.patch(
        name=name,
        namespace=namespace,
        body={"metadata": {"annotations": {key: value}}},
        content_type=MERGE_PATCH,
    )
    pod: dict[str, Any] = pods.get(name=name, namespace=namespace).to_dict()
    status = pod.get("status") or {}
    now = _now()
    statuses = [dict(s) for s in status.get("containerStatuses") or []]
    target = next((s for s in statuses if s.get("name") == container), None)
    if target is None:
        raise ValueError(f"pod {namespace}/{name} has no status for container {container!r}")
    started = (target.get("state") or {}).get("running", {}).get("startedAt") or now
    terminated = {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": started,
        "finishedAt": now,
        **({"message": message} if message else {}),
    }
    if restarting:
        target["state"] = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off 10s restarting failed container={container} pod={name}",
            }
        }
        target["lastState"] = {"terminated": terminated}
        target["restartCount"] = int(target.get("restartCount") or 0) + 1
    else:
        target["state"] = {"terminated": terminated}
    target["ready"] = False
    target["started"] = False
    conditions = [
        dict(c, status="False", reason="ContainersNotReady", lastTransitionTime=now)
        if c.get("type") in ("Ready", "ContainersReady")
        else c
        for c in status.get("conditions") or []
    ]
    updated = pods.status.patch(
        name=name,
        namespace=namespace,
        body={"status": {"containerStatuses": statuses, "conditions": conditions}},
        content_type=MERGE_PATCH,
    )
    result: dict[str, Any] = updated.to_dict()
    return result

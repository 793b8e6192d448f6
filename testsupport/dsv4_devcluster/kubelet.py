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
from collections.abc import Callable
from typing import Any

from kubernetes.dynamic.exceptions import NotFoundError

#: Pods annotated key=value are never made Running/Ready by the harness's kwok stages.
MANUAL_STATUS_ANNOTATION = ("devcluster.dsv4.io/status", "manual")
#: Pods annotated key=value are not removed by kwok when deleted: they stay Terminating.
HELD_TERMINATION_ANNOTATION = ("devcluster.dsv4.io/termination", "held")

MERGE_PATCH = "application/merge-patch+json"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_pod_running(dyn: Any, namespace: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
    """Wait until kwok reported the pod Running with a pod IP; return it as a dict. A pod
    not created yet (its controller is about to make it) is waited for too."""
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    deadline = time.monotonic() + timeout
    while True:
        status: dict[str, Any] = {"pod": "not created yet"}
        try:
            pod: dict[str, Any] = pods.get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            pass
        else:
            status = pod.get("status") or {}
            if status.get("phase") == "Running" and status.get("podIP"):
                return pod
        if time.monotonic() > deadline:
            raise TimeoutError(f"pod {namespace}/{name} not Running after {timeout}s: {status}")
        time.sleep(0.25)


def hold_termination(dyn: Any, namespace: str, name: str) -> None:
    """Keep the pod Terminating once deleted (as a kubelet does for its grace period) until
    :func:`finish_termination`, instead of kwok removing it within milliseconds."""
    _annotate(dyn, namespace, name, HELD_TERMINATION_ANNOTATION)


def finish_termination(dyn: Any, namespace: str, name: str) -> None:
    """Remove a held Terminating pod the way its kubelet would (grace period 0)."""
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    pods.delete(name=name, namespace=namespace, body={"gracePeriodSeconds": 0})


def _off_kwok_stages(dyn: Any, namespace: str, name: str) -> Any:
    """Annotate the pod so that kwok's stages leave its status alone; the Pod API."""
    return _annotate(dyn, namespace, name, MANUAL_STATUS_ANNOTATION)


def _annotate(dyn: Any, namespace: str, name: str, annotation: tuple[str, str]) -> Any:
    """Set one annotation (key, value) on the pod; return the Pod API."""
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    key, value = annotation
    pods.patch(
        name=name,
        namespace=namespace,
        body={"metadata": {"annotations": {key: value}}},
        content_type=MERGE_PATCH,
    )
    return pods


def _report(
    dyn: Any,
    namespace: str,
    name: str,
    container: str,
    change: Callable[[dict[str, Any], str], None],
    *,
    phase: str | None = None,
    not_ready: str = "ContainersNotReady",
) -> dict[str, Any]:
    """Take the pod off kwok's stages, let `change(container_status, now)` edit the named
    container's status, mark the pod not ready (and set `phase`), write it back; return it."""
    pods = _off_kwok_stages(dyn, namespace, name)
    pod: dict[str, Any] = pods.get(name=name, namespace=namespace).to_dict()
    status = pod.get("status") or {}
    now = _now()
    statuses = [dict(s) for s in status.get("containerStatuses") or []]
    target = next((s for s in statuses if s.get("name") == container), None)
    if target is None:
        raise ValueError(f"pod {namespace}/{name} has no status for container {container!r}")
    change(target, now)
    target["ready"] = False
    target["started"] = False
    conditions = [
        dict(c, status="False", reason=not_ready, lastTransitionTime=now)
        if c.get("type") in ("Ready", "ContainersReady")
        else c
        for c in status.get("conditions") or []
    ]
    body: dict[str, Any] = {"containerStatuses": statuses, "conditions": conditions}
    if phase is not None:
        body["phase"] = phase
    updated = pods.status.patch(
        name=name, namespace=namespace, body={"status": body}, content_type=MERGE_PATCH
    )
    result: dict[str, Any] = updated.to_dict()
    return result


def _terminated(target: dict[str, Any], now: str, reason: str, code: int, message: str) -> Any:
    started = (target.get("state") or {}).get("running", {}).get("startedAt") or now
    return {
        "exitCode": code,
        "reason": reason,
        "startedAt": started,
        "finishedAt": now,
        **({"message": message} if message else {}),
    }


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

    def killed(target: dict[str, Any], now: str) -> None:
        terminated = _terminated(target, now, reason, exit_code, message)
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

    return _report(dyn, namespace, name, container, killed)


def report_pod_exited(
    dyn: Any, namespace: str, name: str, container: str, exit_code: int, message: str = ""
) -> dict[str, Any]:
    """Report a run-to-completion pod (restartPolicy Never, a Job's) as ended: phase
    Succeeded for exit code 0, else Failed, with the container's ``state.terminated`` (exit
    code, reason, the termination message), as a kubelet does after the container exits."""
    reason = "Completed" if exit_code == 0 else "Error"

    def exited(target: dict[str, Any], now: str) -> None:
        target["state"] = {"terminated": _terminated(target, now, reason, exit_code, message)}

    phase = "Succeeded" if exit_code == 0 else "Failed"
    not_ready = "PodCompleted" if exit_code == 0 else "PodFailed"
    return _report(dyn, namespace, name, container, exited, phase=phase, not_ready=not_ready)


def report_container_waiting(
    dyn: Any, namespace: str, name: str, container: str, reason: str, message: str
) -> dict[str, Any]:
    """Report ``container`` as waiting (``ImagePullBackOff``, ``CreateContainerConfigError``,
    ...) and the pod not ready, as a kubelet does when it cannot start the container."""

    def waiting(target: dict[str, Any], now: str) -> None:
        target["state"] = {"waiting": {"reason": reason, "message": message}}

    return _report(dyn, namespace, name, container, waiting)


def report_pod_ip(dyn: Any, namespace: str, name: str, ip: str) -> dict[str, Any]:
    """Give a Running pod the address ``ip`` (``status.podIP`` and ``podIPs``), as if its
    network were there: lets a test put a real process (on a loopback address) behind a pod
    that the code under test finds by its IP. Takes the pod off kwok's stages first."""
    pods = _off_kwok_stages(dyn, namespace, name)
    updated = pods.status.patch(
        name=name,
        namespace=namespace,
        body={"status": {"podIP": ip, "podIPs": [{"ip": ip}]}},
        content_type=MERGE_PATCH,
    )
    result: dict[str, Any] = updated.to_dict()
    return result

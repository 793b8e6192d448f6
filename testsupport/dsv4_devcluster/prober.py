"""The kubelet's part for pods whose process runs on this machine: address, Running, readiness.

kwok makes a pod Running at a made-up IP, where nothing answers. A test that runs a pod's
process itself (the operator with its chart's settings, say) and wants the cluster to route to
it, as the API server does to a webhook Service, uses this module instead:

1. :class:`~dsv4_devcluster.netns.PodNetwork` gives the pod a routable address in a network
   namespace of its own (EndpointSlices refuse loopback addresses, so ``127.0.0.x`` will not
   do), and the process runs there and binds it.
2. :func:`report_pod_started` writes what a kubelet writes once the containers started: phase
   Running, that pod IP, each container running and not yet ready. The pod must carry
   :data:`~dsv4_devcluster.kubelet.MANUAL_STATUS_ANNOTATION` from its creation (chart
   ``podAnnotations``) so that kwok never starts it.
3. :class:`ReadinessProber` runs each container's ``readinessProbe`` (``httpGet``) against the
   pod IP with the probe's own period, timeout and thresholds, and flips the container's
   ``ready`` and the pod's Ready/ContainersReady conditions as a kubelet does. The endpoint
   controllers then add or drop the pod from its Services' EndpointSlices.
"""

from __future__ import annotations

import datetime as dt
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from dsv4_devcluster.kubelet import MANUAL_STATUS_ANNOTATION, MERGE_PATCH


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_pod_started(
    dyn: Any, namespace: str, name: str, ip: str, restarted: tuple[str, int] | None = None
) -> dict[str, Any]:
    """Report the pod Running at ``ip`` with every container started and not ready yet.
    ``restarted``: (reason, exit code) of the containers' last run, for a restart in place
    (the same pod): each container's ``restartCount`` one more, its ``lastState`` that exit."""
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    pod: dict[str, Any] = pods.get(name=name, namespace=namespace).to_dict()
    key, value = MANUAL_STATUS_ANNOTATION
    if (pod["metadata"].get("annotations") or {}).get(key) != value:
        raise ValueError(f"pod {namespace}/{name} lacks the annotation {key}={value}")
    now = _now()
    before = {c["name"]: c for c in (pod.get("status") or {}).get("containerStatuses") or []}
    containers = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }
        for c in pod["spec"]["containers"]
    ]
    if restarted is not None:
        reason, code = restarted
        for container in containers:
            last = before.get(container["name"], {})
            container["restartCount"] = int(last.get("restartCount") or 0) + 1
            began = (last.get("state") or {}).get("running", {}).get("startedAt", now)
            container["lastState"] = {
                "terminated": {
                    "reason": reason, "exitCode": code, "startedAt": began, "finishedAt": now,
                }
            }  # fmt: skip
    conditions = [
        {"type": kind, "status": status, "lastTransitionTime": now}
        for kind, status in (
            ("PodScheduled", "True"),
            ("Initialized", "True"),
            ("ContainersReady", "False"),
            ("Ready", "False"),
        )
    ]
    status = {
        "phase": "Running",
        "hostIP": ip,
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": now,
        "containerStatuses": containers,
        "conditions": conditions,
    }
    updated = pods.status.patch(
        name=name, namespace=namespace, body={"status": status}, content_type=MERGE_PATCH
    )
    result: dict[str, Any] = updated.to_dict()
    return result


def set_pod_ready(dyn: Any, namespace: str, name: str, ready: bool) -> None:
    """Write every container's ``ready`` and the pod's Ready/ContainersReady conditions."""
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    pod: dict[str, Any] = pods.get(name=name, namespace=namespace).to_dict()
    status = pod.get("status") or {}
    now, flag = _now(), "True" if ready else "False"
    containers = [dict(c, ready=ready) for c in status.get("containerStatuses") or []]
    conditions = [
        dict(c, status=flag, lastTransitionTime=now)
        if c.get("type") in ("Ready", "ContainersReady") and c.get("status") != flag
        else c
        for c in status.get("conditions") or []
    ]
    pods.status.patch(
        name=name,
        namespace=namespace,
        body={"status": {"containerStatuses": containers, "conditions": conditions}},
        content_type=MERGE_PATCH,
    )


@dataclass
class _Probe:
    """One container's readinessProbe, resolved against the pod's IP and named ports."""

    url: str
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int

    @classmethod
    def of(cls, pod: dict[str, Any], ip: str) -> list[_Probe]:
        probes = []
        for container in pod["spec"]["containers"]:
            probe = container.get("readinessProbe")
            if not probe:
                continue
            get = probe.get("httpGet") or probe.get("tcpSocket")
            if get is None:
                raise ValueError(f"only httpGet and tcpSocket probes are played: {probe}")
            port = get["port"]
            if isinstance(port, str):
                named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
                port = named[port]
            scheme = str(get.get("scheme", "HTTP")).lower() if "httpGet" in probe else "tcp"
            probes.append(
                cls(
                    url=f"{scheme}://{ip}:{port}{get.get('path', '/')}",
                    period=float(probe.get("periodSeconds", 10)),
                    timeout=float(probe.get("timeoutSeconds", 1)),
                    success_threshold=int(probe.get("successThreshold", 1)),
                    failure_threshold=int(probe.get("failureThreshold", 3)),
                )
            )
        return probes

    def passes(self) -> bool:
        if self.url.startswith("tcp://"):
            host, port = self.url[len("tcp://") :].rstrip("/").rsplit(":", 1)
            try:
                socket.create_connection((host, int(port)), timeout=self.timeout).close()
            except OSError:
                return False
            return True
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as response:
                status: int = response.status
                return 200 <= status < 400
        except (OSError, urllib.error.URLError):
            return False


@dataclass
class _PodState:
    probes: list[_Probe]
    ready: bool = False
    streak: int = 0  # consecutive results that disagree with `ready`
    due: float = 0.0
    transitions: list[tuple[float, bool]] = field(default_factory=list)


class ReadinessProber:
    """Play the kubelet's readiness prober for pods reported with :func:`report_pod_started`.

    ``transitions(name)`` lists the (monotonic time, ready) changes this prober wrote, so a
    test can tell when a pod left its Services' endpoints.
    """

    def __init__(self, dyn: Any, namespace: str) -> None:
        self.dyn, self.namespace = dyn, namespace
        self._pods: dict[str, _PodState] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="readiness-prober", daemon=True)

    def add(self, name: str, ip: str) -> None:
        pods = self.dyn.resources.get(api_version="v1", kind="Pod")
        pod = pods.get(name=name, namespace=self.namespace).to_dict()
        with self._lock:
            self._pods[name] = _PodState(_Probe.of(pod, ip))

    def remove(self, name: str) -> None:
        """Stop probing the pod (it was deleted)."""
        with self._lock:
            self._pods.pop(name, None)

    def ready(self, name: str) -> bool:
        with self._lock:
            return self._pods[name].ready

    def transitions(self, name: str) -> list[tuple[float, bool]]:
        with self._lock:
            return list(self._pods[name].transitions)

    def __enter__(self) -> ReadinessProber:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                due = [(n, s) for n, s in self._pods.items() if s.due <= now]
            for name, state in due:
                self._probe(name, state)
            self._stop.wait(0.1)

    def _probe(self, name: str, state: _PodState) -> None:
        # No readiness probe: a kubelet reports the running containers ready at once.
        passed = all(p.passes() for p in state.probes)
        state.due = time.monotonic() + min((p.period for p in state.probes), default=10.0)
        if passed == state.ready:
            state.streak = 0
            return
        state.streak += 1
        needed = max(
            (p.success_threshold if passed else p.failure_threshold for p in state.probes),
            default=1,
        )
        if state.streak < needed:
            return
        try:
            set_pod_ready(self.dyn, self.namespace, name, passed)
        except Exception:  # the pod may be gone (deleted); the next round retries
            return
        with self._lock:
            state.ready, state.streak = passed, 0
            state.transitions.append((time.monotonic(), passed))

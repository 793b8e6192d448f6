"""The playground's pod runner: the kubelet's part for pods bound to its nodes, with host
processes in network namespaces instead of containers.

kwok keeps the nodes (Ready, leases) and removes deleted pods; the runner polls the pods bound
to a node and, for each new one whose containers it knows (:mod:`.playground_pods`):

1. gives it an address in a network namespace of its own (:class:`~.netns.PodNetwork`), a
   route to the other pods, the API server (and the stand-in Hub) on its loopback, and an
   /etc/hosts with the other pods' DNS names (``<pod>.<service>.<ns>.svc``: no cluster DNS);
2. makes its volumes, a kubeconfig with its ServiceAccount's token (``KUBECONFIG``: the
   in-cluster token path is not there), reports it Running at its address and starts its
   containers' processes (``ip netns exec``), logs under ``<root>/pods/<ns>_<name>/``;
3. plays the readiness probes (:class:`~.prober.ReadinessProber`), restarts a container of
   a ``restartPolicy: Always`` pod that exits (CrashLoopBackOff reported), and reports a pod
   that runs to completion Succeeded or Failed with its exit code;
4. stops the processes and removes the namespace once the pod is deleted.

A pod it cannot run gets ``ContainerCreating``-style waiting status with the reason
``ImageNotInPlayground`` and is listed in :attr:`PodRunner.unrunnable`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import yaml
from kubernetes import client as k8s

from dsv4_devcluster.kubelet import (
    MANUAL_STATUS_ANNOTATION,
    MERGE_PATCH,
    report_container_terminated,
    report_pod_exited,
)
from dsv4_devcluster.netns import Pod, PodNetwork
from dsv4_devcluster.playground_pods import (
    Launch,
    NotRunnable,
    NotYet,
    launches,
    materialize_volumes,
)
from dsv4_devcluster.playground_services import (
    ServicePort,
    ServiceRelay,
    host_lines,
    service_ports,
)
from dsv4_devcluster.prober import ReadinessProber, report_pod_started

RESTART_BACKOFF_SECONDS = 2.0


@dataclass
class _Container:
    launch: Launch
    log: BinaryIO
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exit_code: int | None = None


@dataclass
class RunningPod:
    """One pod the runner runs: its network namespace and its containers' processes."""

    namespace: str
    name: str
    uid: str
    network: Pod
    directory: Path
    restart_always: bool
    hostname: str = ""
    containers: list[_Container] = field(default_factory=list)
    services: ServiceRelay | None = None


class PodRunner:
    """``PodRunner(control_plane, network, root, relay_ports).start()``; ``stop()`` ends all."""

    def __init__(
        self,
        control_plane: Any,
        network: PodNetwork,
        root: Path,
        relay_ports: tuple[int, ...] = (),
        extra_env: dict[str, str] | None = None,
        interval: float = 0.5,
    ) -> None:
        self.cp, self.network, self.root = control_plane, network, root
        self.dyn = control_plane.dynamic_client()
        self.relay_ports, self.interval = relay_ports, interval
        self.extra_env = dict(extra_env or {})
        self.running: dict[str, RunningPod] = {}
        self.unrunnable: dict[str, str] = {}
        self.errors: list[str] = []
        self.on_event: Any = None  # called with a line for each pod started, refused, ended
        self._probers: dict[str, ReadinessProber] = {}
        self._services: list[ServicePort] = []
        self._relayed: list[ServicePort] = []  # what every running pod's relays point at
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-runner", daemon=True)

    def start(self) -> PodRunner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for pod in list(self.running.values()):
            self._remove(pod)
        for prober in self._probers.values():
            prober.__exit__(None, None, None)

    def kinds(self) -> dict[str, str]:
        """``namespace/pod/container`` -> what runs it (real or stand-in), for the pods running."""
        with self._lock:
            return {
                f"{p.namespace}/{p.name}/{c.launch.container}": c.launch.kind
                for p in self.running.values()
                for c in p.containers
            }

    def service_endpoints(self, service: str, namespace: str) -> list[tuple[str, int]]:
        """The ready endpoints every running pod's relay of a Service now connects to. They
        follow the Service's EndpointSlices one sync later, as kube-proxy's rules do: a
        connection before that is refused, as a Service with no ready endpoint refuses it."""
        name = f"{service}.{namespace}"
        return [e for port in self._relayed if port.name == name for e in port.endpoints]

    def command_in_pod(self, namespace: str, name: str, argv: list[str]) -> list[str]:
        """`argv` run in a running pod's network namespace (`kubectl exec`, networking only)."""
        with self._lock:
            pod = next(
                (p for p in self.running.values() if (p.namespace, p.name) == (namespace, name)),
                None,
            )
        if pod is None:
            raise LookupError(f"the playground runs no pod {namespace}/{name}")
        return pod.network.command(argv)

    def _say(self, line: str) -> None:
        if self.on_event is not None:
            self.on_event(line)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception as error:  # an API hiccup: the next round retries
                message = f"{type(error).__name__}: {error}"
                if not self.errors or self.errors[-1] != message:  # once, not every round
                    self.errors.append(message)

    def sync(self) -> None:
        pods = self.dyn.resources.get(api_version="v1", kind="Pod")
        listed = pods.get(field_selector="spec.nodeName!=").to_dict()["items"]
        live = {
            p["metadata"]["uid"]: p for p in listed if not p["metadata"].get("deletionTimestamp")
        }
        for uid in [u for u in self.running if u not in live]:
            self._remove(self.running[uid])
        for uid, pod in live.items():
            if uid in self.running:
                continue
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            phase = (pod.get("status") or {}).get("phase")
            if key in self.unrunnable or phase in ("Succeeded", "Failed"):
                continue
            try:
                self._launch(pod)
            except NotYet:
                continue
            except NotRunnable as refusal:
                self._refuse(pod, str(refusal))
        self._services = service_ports(self.dyn)
        self._write_hosts()
        for running in list(self.running.values()):
            if running.services is not None:
                running.services.update(self._services)
            self._watch(running)
        self._relayed = self._services

    def _refuse(self, pod: dict[str, Any], reason: str) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        self.unrunnable[key] = reason
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        waiting = {"reason": "ImageNotInPlayground", "message": reason}
        status = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [
                {"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                 "restartCount": 0, "state": {"waiting": waiting}}
                for c in pod["spec"]["containers"]
            ],
        }  # fmt: skip
        pods = self.dyn.resources.get(api_version="v1", kind="Pod")
        pods.status.patch(
            name=meta["name"],
            namespace=meta["namespace"],
            body={"status": status},
            content_type=MERGE_PATCH,
        )
        self._say(f"cannot run pod {key}: {reason}")

    def _kubeconfig(self, namespace: str, account: str, path: Path) -> Path:
        """A kubeconfig that authenticates as the pod's ServiceAccount (a TokenRequest)."""
        api = self.cp.api_client()
        try:
            request = k8s.AuthenticationV1TokenRequest(
                spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=86400)
            )
            core = k8s.CoreV1Api(api)
            made = core.create_namespaced_service_account_token(account, namespace, request)
        finally:
            api.close()
        if made.status is None:
            raise RuntimeError(f"no token for ServiceAccount {namespace}/{account}")
        token = made.status.token
        config = yaml.safe_load(self.cp.kubeconfig_path.read_text())
        config["users"] = [{"name": account, "user": {"token": token}}]
        for context in config["contexts"]:
            context["context"]["user"] = account
        path.write_text(yaml.safe_dump(config))
        return path

    def _launch(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        namespace, name = meta["namespace"], meta["name"]
        directory = self.root / "pods" / f"{namespace}_{name}"
        directory.mkdir(parents=True, exist_ok=True)
        volumes = materialize_volumes(self.dyn, pod, directory)
        kubeconfig = self._kubeconfig(
            namespace, spec.get("serviceAccountName") or "default", directory / "kubeconfig"
        )
        base_env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(directory),
            "KUBECONFIG": str(kubeconfig),
            "DSV4_TERMINATION_LOG": str(directory / "termination-log"),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        planned = launches(self.dyn, pod, volumes, base_env)
        network = self.network.pod()
        try:
            self.network.route_between_pods(network)
            for port in self.relay_ports:
                network.relay_loopback(port)
            running = RunningPod(
                namespace, name, meta["uid"], network, directory,
                restart_always=spec.get("restartPolicy", "Always") == "Always",
                hostname=self._dns_name(pod), services=ServiceRelay(network, _declared_ports(pod)),
            )  # fmt: skip
            assert running.services is not None
            running.services.update(self._services)
            with self._lock:
                self.running[meta["uid"]] = running
            self._write_hosts()
            pods = self.dyn.resources.get(api_version="v1", kind="Pod")
            key, value = MANUAL_STATUS_ANNOTATION
            pods.patch(
                name=name, namespace=namespace,
                body={"metadata": {"annotations": {key: value}}}, content_type=MERGE_PATCH,
            )  # fmt: skip
            report_pod_started(self.dyn, namespace, name, network.ip)
            for launch in planned:
                log = (directory / f"{launch.container}.log").open("ab", buffering=0)
                container = _Container(launch, log)
                running.containers.append(container)
                self._spawn(running, container)
            self._prober(namespace).add(name, network.ip)
        except Exception:
            self._remove(self.running.get(meta["uid"]) or RunningPod(
                namespace, name, meta["uid"], network, directory, restart_always=False
            ))  # fmt: skip
            raise
        kinds = ", ".join(f"{c.launch.container} ({c.launch.kind})" for c in running.containers)
        self._say(f"running pod {namespace}/{name} at {network.ip}: {kinds}")

    def _dns_name(self, pod: dict[str, Any]) -> str:
        spec, meta = pod["spec"], pod["metadata"]
        if spec.get("hostname") and spec.get("subdomain"):
            return f"{spec['hostname']}.{spec['subdomain']}.{meta['namespace']}.svc"
        return ""

    def _write_hosts(self) -> None:
        with self._lock:
            pods = list(self.running.values())
        names = sorted(
            f"{p.network.ip}\t{p.hostname} {p.hostname}.cluster.local" for p in pods if p.hostname
        )
        services = host_lines(self._services)
        text = "\n".join(["127.0.0.1\tlocalhost", *names, *services]) + "\n"
        for pod in pods:
            pod.network.write_hosts(text)

    def _spawn(self, running: RunningPod, container: _Container) -> None:
        launch = container.launch
        # Killed with the runner's thread even if the playground is SIGKILLed.
        setpriv = shutil.which("setpriv")
        prefix = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
        container.process = subprocess.Popen(
            running.network.command([*prefix, *launch.argv]),
            env=launch.env,
            cwd=running.directory,
            stdin=subprocess.DEVNULL,
            stdout=container.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _prober(self, namespace: str) -> ReadinessProber:
        if namespace not in self._probers:
            self._probers[namespace] = ReadinessProber(self.dyn, namespace).__enter__()
        return self._probers[namespace]

    def _watch(self, running: RunningPod) -> None:
        """Restart an exited container of an Always pod; report a finished one-shot pod."""
        for container in running.containers:
            process = container.process
            if process is None or container.exit_code is not None or process.poll() is None:
                continue
            code = process.returncode
            if running.restart_always:
                container.restarts += 1
                report_container_terminated(
                    self.dyn, running.namespace, running.name, container.launch.container,
                    reason="Error", exit_code=code,
                )  # fmt: skip
                self._say(f"{running.namespace}/{running.name} {container.launch.container} "
                          f"exited {code}; restarting")  # fmt: skip
                time.sleep(RESTART_BACKOFF_SECONDS)
                self._spawn(running, container)
            else:
                container.exit_code = code
        one_shot = not running.restart_always and running.containers
        if one_shot and all(c.exit_code is not None for c in running.containers):
            failed = [c for c in running.containers if c.exit_code]
            last = (failed or running.containers)[0]
            log = running.directory / "termination-log"
            message = log.read_text()[-4096:] if log.is_file() else ""
            report_pod_exited(
                self.dyn, running.namespace, running.name, last.launch.container,
                last.exit_code or 0, message,
            )  # fmt: skip
            self._say(f"pod {running.namespace}/{running.name} ended: exit {last.exit_code}")
            self.running.pop(running.uid, None)
            self._release(running)

    def _remove(self, running: RunningPod) -> None:
        for container in running.containers:
            process = container.process
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for container in running.containers:
            process = container.process
            if process is None:
                continue
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        with self._lock:
            self.running.pop(running.uid, None)
        self._release(running)

    def _release(self, running: RunningPod) -> None:
        prober = self._probers.get(running.namespace)
        if prober is not None:
            prober.remove(running.name)
        for container in running.containers:
            container.log.close()
        if running.services is not None:
            running.services.close()
        self.network.remove(running.network)


def _declared_ports(pod: dict[str, Any]) -> frozenset[int]:
    return frozenset(
        int(port["containerPort"])
        for container in pod["spec"]["containers"]
        for port in container.get("ports") or []
    )

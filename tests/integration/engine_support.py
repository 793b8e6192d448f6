"""The engine double in place of each engine pod, where the guard reads engines: at the pod's IP.

kwok runs no container and gives pods made-up IPs. `PodEngines` gives the engine pod of each
role (one replica each) a loopback address of its own (`report_pod_ip`) and runs the engine
double there on the engine port, started with that role's rendered argv and env (as
`EngineKubelet` does for one role) when a new pod of the StatefulSet's revision runs, and
stopped when it goes. So what the operator reads at a pod's IP (/metrics, /server_info)
is that pod's revision's, and a rollout replaces it with the new pod's, as on a real node.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, report_pod_ip
from dsv4_devcluster.deployments import Cluster, rtx_pool, weights_volume
from dsv4_devcluster.fleet import replace_flag
from dsv4_devcluster.kubelet import MANUAL_STATUS_ANNOTATION
from dsv4_devcluster.prober import ReadinessProber, report_pod_started
from dsv4_engine_double.process import DoubleProcess, launch_from_statefulset
from dsv4_operator.api.limits import ENGINE_PORT
from dsv4_operator.names import (
    LWS_GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    LWS_WORKER_INDEX_LABEL,
    PROBE_LABEL,
    ROLE_LABEL,
    SHADOW_OF_LABEL,
)

from .guard_support import (
    ENGINE_LOAD,
    ENTRYPOINT_LENGTH,
    VAR,
    base_env,
    double_env,
    paired_prefill_command,
    with_pair_hicache,
)

ROLES = ("prefill", "decode")
# Engine pods' annotations for `PodEngines(kubelet=True)`: kwok never starts them.
KUBELET_ANNOTATIONS = dict([MANUAL_STATUS_ANNOTATION])
# What the chart ships (templates/priorityclass.yaml) under a release named dsv4: the
# culprit search's shadow pods name it.
BISECT_PRIORITY_CLASS = "dsv4-bisect"


def gpu_pool_fixture(prefix: str, count: int, *, bisect_priority_class: bool = False) -> Any:
    """A module-scoped `gpu_pool` fixture: `count` RTX PRO nodes named `<prefix>-<i>` in the
    test pool (and the culprit search's PriorityClass, if asked), for the `cluster` fixture
    of :func:`cluster_fixture`. Assign it to `gpu_pool` in the test module."""

    @pytest.fixture(scope="module")
    def gpu_pool(control_plane: ControlPlane, dsv4_crd: dict[str, Any]) -> list[str]:
        nodes = rtx_pool(control_plane, prefix, count)
        if bisect_priority_class:
            classes = control_plane.dynamic_client().resources.get(
                api_version="scheduling.k8s.io/v1", kind="PriorityClass"
            )
            body = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": BISECT_PRIORITY_CLASS},
                "value": -100,
                "preemptionPolicy": "Never",
            }
            classes.server_side_apply(body=body, name=BISECT_PRIORITY_CLASS, field_manager="tests")
        return nodes

    return gpu_pool


def cluster_fixture() -> Any:
    """A `cluster` fixture: the test's namespace with the weights volume, on the module's
    `gpu_pool` (:func:`gpu_pool_fixture`). Assign it to `cluster` in the test module."""

    @pytest.fixture
    def cluster(dyn: Any, namespace: str, gpu_pool: list[str]) -> Cluster:
        weights_volume(dyn, namespace)
        return Cluster(dyn, namespace)

    return cluster


def loopback_ips() -> dict[str, str]:
    """A loopback address per role, unlikely to be another test's (tests run in parallel)."""
    base = f"127.{random.randrange(32, 250)}.{random.randrange(1, 250)}"
    return {"prefill": f"{base}.2", "decode": f"{base}.3"}


class PodEngines:
    """One engine double per role at the role's pod IP; see the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        ips: dict[str, str],
        log_dir: Path,
        name: str = "dsv4-flash",
        knobs: dict[str, str] | None = None,
        revision_knobs: dict[str, dict[str, str]] | None = None,
        kubelet: bool = False,
    ):
        """`knobs`: the double's own variables (DSV4_DOUBLE_*), for every engine it runs;
        `revision_knobs`: more, for the engines of one revision. `kubelet`: the engine pods
        carry `KUBELET_ANNOTATIONS` (kwok leaves them Pending), and each is reported Running
        at its address, not ready, when its double starts, then Ready once its
        readinessProbe passes, as a kubelet's prober does (dsv4_devcluster.prober); else
        kwok reports them Ready at once."""
        self.cluster, self.ips, self.log_dir, self.name = cluster, ips, log_dir, name
        self.knobs = dict(knobs or {})
        self.revision_knobs = dict(revision_knobs or {})
        self.prober = ReadinessProber(cluster.dyn, cluster.namespace) if kubelet else None
        self.pod_names: dict[str, str] = {}  # role -> the pod its double stands for
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.running: dict[str, tuple[str, dict[str, str]] | None] = dict.fromkeys(ROLES)
        self.starts = 0
        self.exit_reasons: dict[str, str] = {}  # role -> the reason its next exit reports
        # (time.monotonic(), role, revision) of every engine started: a change's onset.
        self.launches: list[tuple[float, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        """The decode engine: the server that answers the client in PD."""
        return f"http://{self.ips['decode']}:{ENGINE_PORT}"

    def env(self, role: str = "decode") -> dict[str, str]:
        running = self.running[role]
        return dict(running[1]) if running else {}

    def start(self) -> PodEngines:
        if self.prober is not None:
            self.prober.__enter__()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for role in ROLES:
            self._kill(role)
        if self.prober is not None:
            self.prober.__exit__()

    def crash(self, role: str, reason: str = "Error") -> None:
        """The role's engine dies (SIGKILL), reported with `reason`; restarted in its pod."""
        self.exit_reasons[role] = reason
        self.procs[role].kill()

    def _kill(self, role: str) -> None:
        pod = self.pod_names.pop(role, None)
        if self.prober is not None and pod is not None:
            self.prober.remove(pod)
        proc = self.procs.pop(role, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _pod(self, role: str, revision: str) -> dict[str, Any] | None:
        """The role's running pod of `revision` (none while the rollout replaces it); with
        `kubelet`, its scheduled pod (this kubelet starts it)."""
        pods = self.cluster.pods(f"dsv4.io/deployment={self.name},dsv4.io/role={role}")
        return next(
            (
                p
                for p in pods
                if p["metadata"]["labels"].get("dsv4.io/revision") == revision
                and not p["metadata"].get("deletionTimestamp")
                and (
                    (p.get("status") or {}).get("phase") == "Running"
                    or (self.prober is not None and p["spec"].get("nodeName"))
                )
            ),
            None,
        )

    def launched(self, role: str, revision: str) -> float:
        """When the engine of `role` serving `revision` was first started (time.monotonic())."""
        return min(t for t, r, rev in self.launches if r == role and rev == revision)

    def _desired(self, role: str) -> tuple[str, dict[str, str], list[str], str, str] | None:
        """(pod uid, env, argv, pod name, revision) for the role's pod, or None."""
        children = self.cluster.children(self.name)
        sts = children.get(("StatefulSet", f"{self.name}-{role}"))
        if sts is None:
            return None
        template = sts["spec"]["template"]
        revision = template["metadata"]["labels"]["dsv4.io/revision"]
        stored = next(
            (
                r
                for r in self.cluster.revisions(self.name)
                if r["metadata"]["labels"]["dsv4.io/revision"] == revision
            ),
            None,
        )
        pod = self._pod(role, revision)
        if stored is None or pod is None:
            return None
        container = template["spec"]["containers"][0]
        env = double_env(container, stored)
        env["DSV4_DOUBLE_LOAD"] = str(ENGINE_LOAD)
        env["DSV4_DOUBLE_LATENCY_MS"] = "20"
        env.update(self.knobs)
        env.update(self.revision_knobs.get(revision, {}))
        command = list(container["command"])
        if role == "decode":
            # As EngineKubelet: the decode double stands for the pair, HiCache included.
            prefill_command = paired_prefill_command(children, self.name, revision)
            if prefill_command is None:
                return None
            command = with_pair_hicache(command, prefill_command)
        return pod["metadata"]["uid"], env, command, pod["metadata"]["name"], revision

    def _run(self) -> None:
        while not self._stop.is_set():
            for role in ROLES:
                try:
                    desired = self._desired(role)
                except Exception:  # the API server is busy; look again
                    continue
                want = (desired[0], desired[1]) if desired else None
                proc = self.procs.get(role)
                exited = proc is not None and proc.poll() is not None
                if want != self.running[role] or exited:
                    # The same pod's engine exited: a kubelet restarts the container in place.
                    restarted = (
                        (self.exit_reasons.pop(role, "Error"), _exit_code(proc))
                        if exited and proc is not None and want == self.running[role]
                        else None
                    )
                    self._kill(role)
                    if desired is not None:
                        self._launch(role, *desired, restarted=restarted)
                    self.running[role] = want
            time.sleep(0.3)

    def _launch(
        self,
        role: str,
        uid: str,
        env: dict[str, str],
        command: list[str],
        pod: str,
        revision: str,
        restarted: tuple[str, int] | None = None,
    ) -> None:
        """Start the role's double for `pod`; `restarted`: (reason, exit code) when it is the
        same pod's engine started again, reported as a restart in place (`kubelet`)."""
        ip = self.ips[role]
        args = replace_flag(command[ENTRYPOINT_LENGTH:], "--host", ip)
        args = replace_flag(args, "--port", str(ENGINE_PORT))
        log = (self.log_dir / f"engine-{role}-{self.starts}.log").open("ab")
        self.procs[role] = subprocess.Popen(
            [sys.executable, "-m", "dsv4_engine_double", *args],
            env={**base_env(), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.starts += 1
        self.launches.append((time.monotonic(), role, revision))
        self.pod_names[role] = pod
        if self.prober is None:
            report_pod_ip(self.cluster.dyn, self.cluster.namespace, pod, ip)
            return
        report_pod_started(self.cluster.dyn, self.cluster.namespace, pod, ip, restarted)
        self.prober.add(pod, ip)


def _exit_code(proc: subprocess.Popen[bytes]) -> int:
    """The exit code a container runtime reports: 128 + the signal for a killed process."""
    code = proc.returncode
    return 128 - code if code < 0 else code


class GroupEngines:
    """The kubelet of a multi-node deployment's engine pods, which carry `KUBELET_ANNOTATIONS`
    (kwok leaves them Pending): once every pod of a group is scheduled, each gets an engine
    double at a loopback address of its own, run with its LeaderWorkerSet template's argv as
    the kubelet expands it, and is reported Running there; a pod turns Ready as a kubelet's
    prober finds it (dsv4_devcluster.prober: a worker, which has no probe, at once).

    The workers' doubles (`--node-rank` 1 or more: sglang's health-only server) start first
    and the leader's once they listen, as a leader answers only once every rank has joined.
    For a deployment that does not roll (a pod's double is never replaced). Each double's log
    goes to `log_dir` (`engine-<pod>.log`) when it stops."""

    def __init__(self, cluster: Cluster, log_dir: Path, name: str = "dsv4-flash") -> None:
        self.cluster, self.log_dir, self.name = cluster, log_dir, name
        self.base = f"127.{random.randrange(32, 250)}.{random.randrange(1, 250)}"
        self.doubles: dict[str, DoubleProcess] = {}  # pod name -> its double
        self.addresses: dict[str, str] = {}  # pod name -> its double's address
        self.prober = ReadinessProber(cluster.dyn, cluster.namespace)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GroupEngines:
        self.prober.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        for pod, double in self.doubles.items():
            double.stop()
            (self.log_dir / f"engine-{pod}.log").write_text(double.log)
        self.prober.__exit__()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pods = self.cluster.pods(f"dsv4.io/deployment={self.name}")
                for group in self._scheduled_groups(pods):
                    for pod in sorted(group, key=lambda p: -_worker_index(p)):  # leader last
                        self._start(pod)
            except Exception:  # the API server is busy: look again
                pass
            time.sleep(0.3)

    def _scheduled_groups(self, pods: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """The engine groups whose pods are all scheduled and not started yet."""
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for pod in pods:
            labels = pod["metadata"]["labels"]
            if labels.get(ROLE_LABEL) in ROLES and pod["metadata"]["name"] not in self.doubles:
                key = (labels[LWS_NAME_LABEL], labels[LWS_GROUP_INDEX_LABEL])
                groups.setdefault(key, []).append(pod)
        children = self.cluster.children(self.name)

        def size(lws: str) -> int:
            return int(children[("LeaderWorkerSet", lws)]["spec"]["leaderWorkerTemplate"]["size"])

        return [
            group
            for (lws, _), group in groups.items()
            if len(group) == size(lws) and all(p["spec"].get("nodeName") for p in group)
        ]

    def _start(self, pod: dict[str, Any]) -> None:
        labels, name = pod["metadata"]["labels"], pod["metadata"]["name"]
        worker = _worker_index(pod)
        lws = self.cluster.children(self.name)[("LeaderWorkerSet", labels[LWS_NAME_LABEL])]
        group = lws["spec"]["leaderWorkerTemplate"]
        template = group["leaderTemplate" if worker == 0 else "workerTemplate"]
        container = template["spec"]["containers"][0]
        [stored] = [
            r
            for r in self.cluster.revisions(self.name)
            if r["metadata"]["labels"]["dsv4.io/revision"] == labels["dsv4.io/revision"]
        ]
        env = double_env(container, stored)
        ip = f"{self.base}.{10 + len(self.addresses)}"
        known = {
            "LWS_LEADER_ADDRESS": ip,  # the rendezvous is not played: any address will do
            "LWS_GROUP_SIZE": str(group["size"]),
            "LWS_WORKER_INDEX": str(worker),
        }
        command = [VAR.sub(lambda m: known.get(m[1], m[0]), arg) for arg in container["command"]]
        args = replace_flag(command[ENTRYPOINT_LENGTH:], "--host", ip)
        args = replace_flag(args, "--port", str(ENGINE_PORT))
        self.addresses[name] = ip
        self.doubles[name] = DoubleProcess(args, env, bind=False).start(timeout=60)
        report_pod_started(self.cluster.dyn, self.cluster.namespace, name, ip)
        self.prober.add(name, ip)


def _worker_index(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["labels"][LWS_WORKER_INDEX_LABEL])


class ShadowEngines:
    """An engine double behind each culprit-search shadow pair (docs/bisect.md), as PodEngines
    does for the serving pair: every Running shadow pod gets a loopback address of its own;
    the decode pod's runs the double with its StatefulSet's argv and env (the prefill's HiCache
    included, as the decode double stands for the pair), reported only once it listens."""

    def __init__(
        self, cluster: Cluster, log_dir: Path, knobs: dict[str, str], name: str = "dsv4-flash"
    ) -> None:
        self.cluster, self.log_dir, self.name, self.knobs = cluster, log_dir, name, dict(knobs)
        self.base = f"127.{random.randrange(32, 250)}.{random.randrange(1, 250)}"
        self.next_octet = 10
        self.doubles: dict[str, DoubleProcess] = {}  # pod uid -> its double
        self.addressed: set[str] = set()  # pod uids given an address
        self.pods_seen: set[str] = set()  # shadow pod names ever seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ShadowEngines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for double in self.doubles.values():
            double.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # the API server is busy; look again
                self._round()
            time.sleep(0.2)

    def _address(self) -> str:
        self.next_octet += 1
        return f"{self.base}.{self.next_octet}"

    def _round(self) -> None:
        pods = self.cluster.pods(f"{SHADOW_OF_LABEL}={self.name}")
        running = {}
        for pod in pods:
            meta = pod["metadata"]
            self.pods_seen.add(meta["name"])
            if (pod.get("status") or {}).get("phase") == "Running" and not meta.get(
                "deletionTimestamp"
            ):
                running[meta["uid"]] = pod
        for uid in [u for u in self.doubles if u not in running]:
            self.doubles.pop(uid).stop()
        for uid, pod in running.items():
            if uid in self.addressed:
                continue
            ip = self._address()
            role = pod["metadata"]["labels"][ROLE_LABEL]
            if role == "decode":
                double = self._double(pod, ip)
                if double is None:
                    continue
                self.doubles[uid] = double.start()
            report_pod_ip(self.cluster.dyn, self.cluster.namespace, pod["metadata"]["name"], ip)
            self.addressed.add(uid)

    def _double(self, pod: dict[str, Any], ip: str) -> DoubleProcess | None:
        probe = pod["metadata"]["labels"][PROBE_LABEL]
        statefulsets = {
            s["metadata"]["labels"][ROLE_LABEL]: s
            for s in self.cluster.items(
                "apps/v1", "StatefulSet", f"{SHADOW_OF_LABEL}={self.name},{PROBE_LABEL}={probe}"
            )
        }
        if set(statefulsets) != set(ROLES):
            return None
        args, env = launch_from_statefulset(statefulsets["decode"])
        prefill, _ = launch_from_statefulset(statefulsets["prefill"])
        args = with_pair_hicache(args, prefill)
        args = replace_flag(replace_flag(args, "--host", ip), "--port", str(ENGINE_PORT))
        env = {**env, "DSV4_DOUBLE_LOAD": str(ENGINE_LOAD), "DSV4_DOUBLE_LATENCY_MS": "20"}
        return DoubleProcess(args, {**env, **self.knobs}, bind=False)

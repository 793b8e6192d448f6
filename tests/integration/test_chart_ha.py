"""The chart's two replicas behind the webhook Service, called by the API server itself:
admission keeps working while the leader is down, and `helm test` tells a working
installation from one with a broken webhook.

The pods the chart creates are real objects on kwok nodes, but their processes run here: each
replica is `dsv4 run` with its pod's own environment (the chart's env, fieldRefs resolved),
the chart ServiceAccount's token and the chart's certificate, in a network namespace of its
own (`dsv4_devcluster.netns`) whose address is reported as the pod's IP; no host interface
gets an address. `dsv4_devcluster.prober` plays the kubelet's readiness
probe from the pod spec; the controller-manager's endpoint controllers and the API server
(`--enable-aggregator-routing`, no kube-proxy here) route webhook calls as on a cluster. The
`helm test` pod is run the same way: its args, as `dsv4`, with its ServiceAccount's token.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import POOL_LABEL, Cluster, example, rtx_pool, weights_volume
from dsv4_devcluster.kubelet import MANUAL_STATUS_ANNOTATION, report_pod_exited
from dsv4_devcluster.netns import Pod, PodNetwork
from dsv4_devcluster.operator import OperatorProcess
from dsv4_devcluster.prober import ReadinessProber, report_pod_started

from ..chart.support import tool
from .cluster_support import service_account_kubeconfig
from .helm_support import Helm

pytestmark = pytest.mark.integration
POOL = "chart-ha"
RELEASE = "ha"
FULLNAME = f"{RELEASE}-dsv4-operator"
LEASE_SECONDS = 6
UNSAFE = {"engine.indexKDtype": "bf16", "engine.hicache": {"enabled": True}}


@pytest.fixture(scope="module")
def ha_nodes(control_plane: ControlPlane) -> list[str]:
    return rtx_pool(control_plane, "chart-ha", 2, pool=POOL)


def _pod_env(pod: dict[str, Any], container: str) -> dict[str, str]:
    """The container's environment as a kubelet builds it: values and metadata fieldRefs."""
    (spec,) = [c for c in pod["spec"]["containers"] if c["name"] == container]
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
    }
    env = {}
    for var in spec.get("env") or []:
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:  # the API server omits an empty value
            env[var["name"]] = var.get("value", "")
    return env


class Replica:
    """One operator pod of the chart, its process run here at the pod's IP."""

    def __init__(
        self, pod: dict[str, Any], network: Pod, kubeconfig: Path, certs: Path, logs: Path
    ) -> None:
        self.name, self.ip, self.network = pod["metadata"]["name"], network.ip, network
        env = _pod_env(pod, "operator")
        assert env["DSV4_WEBHOOK_CERT_DIR"] == "/etc/dsv4-operator/webhook-tls"
        env.update(DSV4_WEBHOOK_CERT_DIR=str(certs), DSV4_LISTEN_HOST=network.ip)
        self.process = OperatorProcess(
            kubeconfig, env["DSV4_NAMESPACES"], logs, wrap=network.command, **env
        )

    def start(self) -> Replica:
        self.process.start()
        return self

    def leading(self) -> bool:
        return self.process.metric("dsv4_leader") == 1


def _ready_endpoints(dyn: Any, namespace: str, service: str) -> list[str]:
    slices = dyn.resources.get(api_version="discovery.k8s.io/v1", kind="EndpointSlice")
    found = slices.get(namespace=namespace, label_selector=f"kubernetes.io/service-name={service}")
    return sorted(
        address
        for item in found.to_dict()["items"]
        for endpoint in item.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    )


def _admitted(api: Any, doc: dict[str, Any]) -> str | None:
    """A server-side dry-run create (what `kubectl apply --dry-run=server` sends): None when
    admitted, else the API server's message."""
    try:
        api.create_namespaced_custom_object(
            "dsv4.io", "v1alpha1", doc["metadata"]["namespace"], "dsv4deployments", doc,
            dry_run="All",
        )  # fmt: skip
    except ApiException as error:
        return str(error.body)
    return None


class HelmTestPod:
    """Plays the kubelet for the `helm test` pod: runs its args as `dsv4` with a token of its
    ServiceAccount and reports the exit code as the pod's phase."""

    def __init__(
        self, control_plane: ControlPlane, dyn: Any, namespace: str, tmp: Path, network: Pod
    ) -> None:
        self.cp, self.dyn, self.namespace, self.tmp = control_plane, dyn, namespace, tmp
        self.network = network
        self.output = ""

    def run_once(self) -> None:
        pods = self.dyn.resources.get(api_version="v1", kind="Pod")
        name = f"{FULLNAME}-selftest"

        def scheduled() -> dict[str, Any] | None:
            try:
                pod: dict[str, Any] = pods.get(name=name, namespace=self.namespace).to_dict()
            except Exception:
                return None
            fresh = not (pod.get("status") or {}).get("podIP")
            return pod if fresh and pod["spec"].get("nodeName") else None

        pod = wait_for("the helm test pod to be scheduled", scheduled, timeout=120)
        report_pod_started(self.dyn, self.namespace, name, self.network.ip)
        (container,) = pod["spec"]["containers"]
        kubeconfig = service_account_kubeconfig(
            self.cp, self.namespace, pod["spec"]["serviceAccountName"], self.tmp / "test.kubecfg"
        )
        # The image's entry point is `dsv4` (Dockerfile ENTRYPOINT); the args are the chart's.
        proc = subprocess.run(
            self.network.command([sys.executable, "-m", "dsv4_operator.cli", *container["args"]]),
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.output = proc.stdout + proc.stderr
        report_pod_exited(
            self.dyn, self.namespace, name, container["name"], proc.returncode, self.output[-1024:]
        )

    def helm_test(self, helm: Helm) -> tuple[int, str]:
        """`helm test` with this runner playing the pod; (helm's exit code, selftest output)."""
        runner = threading.Thread(target=self.run_once)
        runner.start()
        result = helm("test", RELEASE, "-n", self.namespace, "--timeout", "3m", check=False)
        runner.join(timeout=180)
        print(f"helm test -> {result.returncode}\n{result.stdout}{result.stderr}\n{self.output}")
        return result.returncode, self.output


@pytest.mark.long(seconds=60)
def test_the_webhook_service_keeps_admitting_while_the_leader_is_down_and_helm_test_tells(
    control_plane: ControlPlane,
    dyn: Any,
    namespace: str,
    work_namespace: str,
    ha_nodes: list[str],
    tmp_path: Path,
) -> None:
    work = work_namespace
    helm = Helm(control_plane.kubeconfig_path)
    key, value = MANUAL_STATUS_ANNOTATION
    values = {
        "nodeSelector": {POOL_LABEL: POOL},
        "crds": {"enabled": False},
        "watchNamespaces": [work],
        "podAnnotations": {key: value},  # kwok leaves these pods to this test
        "leaderElection": {"leaseDurationSeconds": LEASE_SECONDS},
        "probes": {"readiness": {"periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2}},
    }
    helm.install(RELEASE, namespace, values)
    core = k8s.CoreV1Api(control_plane.api_client())
    custom = k8s.CustomObjectsApi(control_plane.api_client())
    with ExitStack() as stack:
        stack.callback(helm.uninstall, RELEASE, namespace)
        network = stack.enter_context(PodNetwork())
        api_port = int(control_plane.server_url.rsplit(":", 1)[1])
        pod_networks = [network.pod(), network.pod(), network.pod()]  # two replicas, helm test
        for pod_network in pod_networks:
            pod_network.relay_loopback(api_port)  # the API server, as a pod reaches it
        pod_ips = sorted(p.ip for p in pod_networks[:2])
        secret = core.read_namespaced_secret(f"{FULLNAME}-webhook-tls", namespace).data
        assert secret is not None
        certs = tmp_path / "webhook-tls"
        certs.mkdir()
        for name in ("tls.crt", "tls.key"):
            (certs / name).write_bytes(base64.b64decode(secret[name]))
        kubeconfig = service_account_kubeconfig(
            control_plane, namespace, FULLNAME, tmp_path / "sa.kubeconfig"
        )

        pods = wait_for(
            "both replicas scheduled", lambda: _scheduled(core, namespace, 2), timeout=120
        )
        prober = stack.enter_context(ReadinessProber(dyn, namespace))
        replicas = []
        in_order = sorted(pods, key=lambda p: p["metadata"]["name"])
        for pod, pod_network in zip(in_order, pod_networks[:2], strict=True):
            report_pod_started(dyn, namespace, pod["metadata"]["name"], pod_network.ip)
            replica = Replica(pod, pod_network, kubeconfig, certs, tmp_path).start()
            stack.callback(replica.process.stop)
            replicas.append(replica)
            prober.add(replica.name, pod_network.ip)
        webhook_service = f"{FULLNAME}-webhook"
        wait_for(
            "both replicas behind the webhook Service",
            lambda: _ready_endpoints(dyn, namespace, webhook_service) == pod_ips,
            timeout=60,
        )
        leader = wait_for(
            "a leader", lambda: next((r for r in replicas if r.leading()), None), timeout=60
        )
        (standby,) = [r for r in replicas if r is not leader]
        tests = HelmTestPod(control_plane, dyn, namespace, tmp_path, pod_networks[2])

        # 1. helm test on a working installation.
        code, output = tests.helm_test(helm)
        assert code == 0, output
        assert "PASS refusesUnsafe: Refused" in output and f"{leader.name} leads" in output

        # 2. The API server calls the webhook through the Service: sound in, unsafe out.
        cluster = Cluster(dyn, work)
        sound, probe = example(work), example(work, name="probe")
        for doc in (sound, probe):
            for role in ("prefill", "decode"):
                doc["spec"][role]["nodeSelector"] = {POOL_LABEL: POOL}
        weights_volume(dyn, work)
        cluster.apply(sound)
        refusal = _admitted(custom, example(work, name="unsafe", **UNSAFE))
        assert refusal is not None and "DSV4-R001" in refusal, refusal
        wait_for("Ready", lambda: cluster.get().get("status", {}).get("phase") == "Ready", 180)

        # 3. A planned stop of the standby (drain, rolling update) refuses nothing: its pod
        # leaves the endpoints at once and the process keeps serving for the preStop sleep.
        (spec,) = [p for p in pods if p["metadata"]["name"] == standby.name]
        grace = spec["spec"]["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
        kubelet = threading.Thread(
            target=_stop_like_a_kubelet, args=(core, namespace, standby, grace)
        )
        core.delete_namespaced_pod(standby.name, namespace)
        kubelet.start()
        planned: list[str | None] = []
        while kubelet.is_alive() or len(planned) < 10:
            planned.append(_admitted(custom, probe))
            time.sleep(0.2)
        refused_planned = [m for m in planned if m is not None]
        print(f"planned stop: {len(refused_planned)} of {len(planned)} dry-run creates refused")
        assert not refused_planned, refused_planned
        # The ReplicaSet's replacement takes the stopped pod's place and address.
        (new,) = wait_for(
            "the replacement pod",
            lambda: _scheduled(core, namespace, 1, {r.name for r in replicas}),
            timeout=120,
        )
        report_pod_started(dyn, namespace, new["metadata"]["name"], standby.ip)
        standby = Replica(new, standby.network, kubeconfig, certs, tmp_path).start()
        stack.callback(standby.process.stop)
        prober.add(standby.name, standby.ip)
        wait_for(
            "the replacement behind the webhook Service",
            lambda: _ready_endpoints(dyn, namespace, webhook_service) == pod_ips,
            timeout=60,
        )

        # 4. Kill the leader; keep asking for admission every 0.2 s, and note when the
        # Service's endpoints (as the API server also reads them) stop listing it.
        leader.process.kill()
        killed = time.monotonic()
        attempts: list[tuple[float, str | None]] = []
        failover = gone = float("inf")
        while True:
            attempts.append((time.monotonic() - killed, _admitted(custom, probe)))
            now = time.monotonic() - killed
            if failover == float("inf") and standby.leading():
                failover = now
            if gone == float("inf") and leader.ip not in _ready_endpoints(
                dyn, namespace, webhook_service
            ):
                gone = now
            if len([t for t, _ in attempts if t > gone]) >= 30 and failover < float("inf"):
                break
            assert now < 120, "the dead replica never left the endpoints"
            time.sleep(0.2)
        left = _left(prober, leader, killed)
        refused = [(t, m) for t, m in attempts if m is not None]
        print(
            f"leader {leader.name} SIGKILLed: readiness failed after {left:.1f}s, out of the "
            f"endpoints after {gone:.1f}s, standby leads after {failover:.1f}s (lease "
            f"{LEASE_SECONDS}s); {len(refused)} of {len(attempts)} dry-run creates refused, "
            f"the last sent at {max((t for t, _ in refused), default=0):.1f}s"
        )
        # A sanity bound only (the figure is printed): the Lease may have been renewed just
        # before the kill, and the standby retries every duration/7.5.
        assert failover <= 2 * LEASE_SECONDS + 3, failover
        assert _ready_endpoints(dyn, namespace, webhook_service) == [standby.ip]
        # Only calls routed to the dead replica while it was an endpoint failed; every call
        # sent once the endpoints had dropped it went through (1 s: the API server's own
        # informer sees the change just after this reader).
        assert all("failed calling webhook" in m for _, m in refused), refused
        late = [(t, m) for t, m in refused if t > gone + 1.0]
        assert not late, late

        # 5. `kubectl apply` of a change is admitted while one replica is down, and the new
        # leader reconciles it.
        sound["spec"]["engine"]["maxRunningRequests"] = 48
        kubectl = [str(tool("kubectl")), "--kubeconfig", str(control_plane.kubeconfig_path)]
        applied = subprocess.run(
            [*kubectl, "apply", "--server-side", "--field-manager", "tests", "-f", "-"],
            input=yaml.safe_dump(sound),
            capture_output=True,
            text=True,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr

        def converged() -> bool:
            obj = cluster.get()
            status = obj.get("status", {})
            generation = obj["metadata"]["generation"]
            return bool(
                status.get("observedGeneration") == generation and status["phase"] == "Ready"
            )

        wait_for("the new leader to reconcile the change", converged, timeout=180)
        assert standby.process.metric("dsv4_reconciles_total")

        # 6. helm test with one replica up passes; with the webhook's CA broken it fails.
        code, output = tests.helm_test(helm)
        assert code == 0, output
        admission = k8s.AdmissionregistrationV1Api(control_plane.api_client())
        broken = admission.read_validating_webhook_configuration(FULLNAME)
        # Another CA (the cluster's own): the replicas' certificate is no longer trusted.
        kubeconfig_doc = yaml.safe_load(control_plane.kubeconfig_path.read_text())
        cluster_ca = kubeconfig_doc["clusters"][0]["cluster"]["certificate-authority-data"]
        assert base64.b64decode(cluster_ca) != base64.b64decode(secret["ca.crt"])
        assert broken.webhooks is not None
        broken.webhooks[0].client_config.ca_bundle = cluster_ca
        admission.replace_validating_webhook_configuration(FULLNAME, broken)
        code, output = tests.helm_test(helm)
        assert code != 0
        assert "FAIL admitsSound: WebhookCallFailed" in output, output
        assert "PASS leader" in output  # the failure is the webhook's alone


def _scheduled(
    core: Any, namespace: str, count: int, exclude: set[str] | None = None
) -> list[dict[str, Any]] | None:
    """The release's `count` scheduled, not deleted pods (not in `exclude`) as dicts, or None."""
    pods = core.list_namespaced_pod(
        namespace,
        label_selector=f"app.kubernetes.io/name=dsv4-operator,app.kubernetes.io/instance={RELEASE}",
    ).items
    found = [
        p
        for p in pods
        if p.spec.node_name
        and not p.metadata.deletion_timestamp
        and p.metadata.name not in (exclude or set())
    ]
    if len(found) != count:
        return None
    return [core.api_client.sanitize_for_serialization(p) for p in found]


def _stop_like_a_kubelet(core: Any, namespace: str, replica: Replica, grace: int) -> None:
    """Once the pod is being deleted: run the preStop sleep, then SIGTERM the process."""

    def deleting() -> bool:
        try:
            pod = core.read_namespaced_pod(replica.name, namespace)
        except ApiException as error:
            return bool(error.status == 404)  # kwok already removed it
        return pod.metadata.deletion_timestamp is not None

    wait_for(f"{replica.name} to be deleted", deleting, timeout=60)
    time.sleep(grace)
    replica.process.stop()


def _left(prober: ReadinessProber, replica: Replica, since: float) -> float:
    """Seconds from `since` until the prober marked `replica` not ready (inf: not yet)."""
    gone = [t for t, ready in prober.transitions(replica.name) if not ready and t >= since]
    return gone[0] - since if gone else float("inf")

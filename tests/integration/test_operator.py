"""The operator against a real API server: create, update (compatible, Recreate, BlueGreen),
delete, invalid specs, a no-op resync, and a kill in the middle of a rollout.

Each test runs its own `dsv4 run` process watching only the test's namespace; kube-scheduler
places the engine pods on kwok GPU nodes of the requested product, and kwok marks them Ready.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dsv4_devcluster import (
    ControlPlane,
    report_container_terminated,
    report_container_waiting,
    report_pod_ip,
    wait_for,
    wait_pod_running,
)
from dsv4_devcluster.deployments import POOL, POOL_LABEL, RTX, Cluster, example, weights_volume
from dsv4_devcluster.operator import OperatorProcess, webhook_operator
from dsv4_devcluster.process import free_port
from dsv4_operator.api.limits import TAP_METRICS_PORT
from dsv4_operator.api.roles import ROLES
from dsv4_operator.kube.objects import StatefulSetView
from tests.chart.support import tool

from .cluster_support import engine_flags, post_pod_warning, statefulset_policy, watch_router

pytestmark = pytest.mark.integration
# The example image declares bf16IndexK + poolSizingFix.
BF16: dict[str, Any] = {"engine.indexKDtype": "bf16"}
THREE_DECODES: dict[str, Any] = {"decode.replicas": 3}


@pytest.fixture(scope="module")
def gpu_pool(control_plane: ControlPlane, dsv4_crd: dict[str, Any]) -> list[str]:
    """Four 8-GPU RTX PRO nodes reserved for these tests, and one H100 node as a decoy."""
    names = [f"op-rtx-{i}" for i in range(4)]
    for name in names:
        control_plane.add_gpu_node(name, gpus=8, product=RTX, labels={POOL_LABEL: POOL})
    control_plane.add_gpu_node(
        "op-h100-0", gpus=8, product="NVIDIA-H100-80GB-HBM3", labels={POOL_LABEL: POOL}
    )
    return names


@pytest.fixture
def cluster(dyn: Any, namespace: str, gpu_pool: list[str]) -> Cluster:
    weights_volume(dyn, namespace)
    return Cluster(dyn, namespace)


@pytest.fixture
def operator(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The session's operator fixture, resyncing every second (the launcher's default: every
    two): the waits here count reconcile passes, not seconds, so they end twice as soon."""
    op = OperatorProcess(
        control_plane.kubeconfig_path, namespace, tmp_path, DSV4_RESYNC_SECONDS="1"
    ).start()
    yield op
    op.stop()
    print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(80)}")


# For tests that count the operator's writes: no guard, whose rounds (each at its own point of
# the canary interval) write what they find, here a blind guard's GuardBlind condition.
NO_GUARD = {"guard.enabled": False}


def _ready(cluster: Cluster, **changes: Any) -> dict[str, Any]:
    cluster.apply(example(cluster.namespace, **changes))
    return cluster.wait_phase("Ready")


def test_create_schedules_on_requested_gpus_and_reports_ready(
    cluster: Cluster, operator: OperatorProcess, gpu_pool: list[str]
) -> None:
    obj = _ready(cluster)
    status = obj["status"]
    assert status["roles"]["prefill"] == {
        "revision": status["currentRevision"],
        "replicas": 1,
        "ready": 1,
    }
    assert status["roles"]["decode"]["ready"] == 1
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Validated"]["status"] == "True"
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Progressing"]["reason"] == "RolloutComplete"
    assert status["plan"]["maxTotalTokens"]["decode"] > 0
    children = cluster.children()
    assert {name for kind, name in children if kind == "StatefulSet"} == {
        "dsv4-flash-prefill",
        "dsv4-flash-decode",
    }
    nodes = cluster.dyn.resources.get(api_version="v1", kind="Node")
    for pod in cluster.pods("dsv4.io/deployment=dsv4-flash,dsv4.io/role in (prefill,decode)"):
        node = nodes.get(name=pod["spec"]["nodeName"]).to_dict()
        # The requested product, never the H100 decoy that carries the same pool label.
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == RTX
        assert pod["status"]["phase"] == "Running"
    [revision] = cluster.revisions()
    assert revision["metadata"]["labels"]["dsv4.io/revision"] == status["currentRevision"]
    cluster.wait_events("Creating")
    # The router pod's leak tap sits at a made-up kwok IP: the guard counts it as unreadable.
    scope = {"namespace": cluster.namespace, "deployment": "dsv4-flash"}
    wait_for(
        "the unreadable tap counted",
        lambda: operator.metric("dsv4_guard_taps_unreachable", **scope) == 1,
        timeout=60,
    )


# What one create may cost (docs/architecture.md, "What a create costs the API server"): the
# plain apply's 9 children, one ControllerRevision, one Event (Creating, which names the
# stored revision) and the status patches of the phases a user sees.
CREATE_REQUESTS = {
    ("patch", "statefulsets"): 2,
    ("patch", "services"): 3,
    ("patch", "deployments"): 1,
    ("patch", "poddisruptionbudgets"): 3,
    ("create", "controllerrevisions"): 1,
    ("create", "events"): 1,
}


def _requests(operator: OperatorProcess, name: str) -> dict[tuple[str, str], float]:
    """The operator's `dsv4_api_writes_total` or `_reads_total`, by (verb, resource)."""
    with urllib.request.urlopen(f"http://{operator.host}:{operator.metrics_port}/metrics") as r:
        text = r.read().decode()
    return {
        (s.labels["verb"], s.labels["resource"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.value
    }


def test_a_create_makes_only_the_requests_the_architecture_lists(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    _ready(cluster, **NO_GUARD)
    cluster.wait_events("Creating")
    operator.more_passes(2)  # anything a pass after Ready would write, written
    writes = _requests(operator, "dsv4_api_writes_total")
    # Progressing in the first pass (no child seen yet: "prefill 0/0 ready"), once more if a
    # pass sees the children before any pod is ready ("0/1"), then one per role whose pods
    # become ready (Ready's message names the roles still waiting; the last one makes the
    # deployment Ready). Pods come up in one pass or three, as the scheduler and kwok go.
    status = writes.pop(("patch", "dsv4deployments/status"), 0)
    assert 2 <= status <= 2 + len(ROLES) + 1, status  # + 1: the router
    assert writes == CREATE_REQUESTS
    # Everything is read from the watch cache. The reads made are the start-up's (whether
    # optional kinds are served and may be listed), none for the deployment: no GET of it
    # per watch event (the culprit search looks at what the watch brought).
    reads = _requests(operator, "dsv4_api_reads_total")
    assert {res for verb, res in reads if verb == "get"} <= {"discovery"}, reads
    # kopf (its own client, not counted above) patched nothing onto the object: it has no
    # resource handler, so no finalizer, no progress or last-handled annotation.
    meta = cluster.get()["metadata"]
    assert not meta.get("finalizers")
    assert not [k for k in meta.get("annotations") or {} if "kopf" in k], meta


def test_the_guard_reads_router_taps_at_their_pod_ips_past_a_cluster_proxy(
    cluster: Cluster, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """A cluster-wide HTTP(S)_PROXY (here one that answers nothing) with the pod range in
    NO_PROXY as a CIDR, which httpx cannot match: the guard still reads each router pod's tap
    directly at its pod IP. The router pod gets a loopback address where a real `dsv4 tap`
    serves its /metrics."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    op = OperatorProcess(
        control_plane.kubeconfig_path,
        namespace,
        tmp_path,
        HTTP_PROXY=nowhere,
        HTTPS_PROXY=nowhere,
        NO_PROXY="127.0.0.1,localhost,127.0.0.0/8",
    ).start()
    pod_ip = "127.0.0.2"
    tap = subprocess.Popen(
        [sys.executable, "-m", "dsv4_operator.cli", "tap", "--upstream", "http://127.0.0.1:9",
         "--listen", f"{pod_ip}:0", "--metrics", f"{pod_ip}:{TAP_METRICS_PORT}",
         "--deployment", "dsv4-flash", "--namespace", namespace],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    scope = {"namespace": namespace, "deployment": "dsv4-flash"}
    try:
        _ready(cluster)
        wait_for(
            "the tap at kwok's made-up IP counted unreadable",
            lambda: op.metric("dsv4_guard_taps_unreachable", **scope) == 1,
            timeout=60,
        )
        [router] = cluster.pods("dsv4.io/deployment=dsv4-flash,dsv4.io/role=router")
        report_pod_ip(cluster.dyn, namespace, router["metadata"]["name"], pod_ip)
        wait_for(
            "the tap read at the pod's IP, not through the proxy",
            lambda: op.metric("dsv4_guard_taps_unreachable", **scope) == 0,
            timeout=60,
        )
    finally:
        tap.terminate()
        tap.wait(10)
        op.stop()
        print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(80)}")


def test_noop_resync_makes_zero_writes(cluster: Cluster, operator: OperatorProcess) -> None:
    _ready(cluster, **NO_GUARD)
    operator.settled()

    def versions() -> dict[Any, str]:
        objs = {**cluster.children(), ("DSV4Deployment", "dsv4-flash"): cluster.get()}
        return {key: obj["metadata"]["resourceVersion"] for key, obj in objs.items()}

    before, writes_before = versions(), operator.metric("dsv4_api_writes_total")
    operator.more_passes(4)  # resyncs every second here
    assert versions() == before
    assert operator.metric("dsv4_api_writes_total") == writes_before


def test_a_sidecar_injected_by_another_writer_causes_no_write(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    """What a service mesh's mutating webhook leaves in a StatefulSet (a sidecar, an env var
    in the engine container) is another manager's: the operator neither removes it nor keeps
    re-applying its own fields."""
    _ready(cluster, **NO_GUARD)
    statefulsets = cluster.dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    injected = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "dsv4-flash-decode", "namespace": cluster.namespace},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "mesh-proxy", "image": "registry.example.com/proxy:1"},
                        {"name": "engine", "env": [{"name": "MESH_ENABLED", "value": "1"}]},
                    ]
                }
            }
        },
    }
    statefulsets.server_side_apply(
        body=injected,
        name="dsv4-flash-decode",
        namespace=cluster.namespace,
        field_manager="mesh-injector",
    )
    # The StatefulSet controller rolls the pod with the sidecar (the operator reports that
    # in status, legitimately); measure once the roll is over and the status has settled.
    wait_for(
        "the decode StatefulSet to roll the sidecar in",
        lambda: (
            StatefulSetView.of(cluster.children()[("StatefulSet", "dsv4-flash-decode")]).rolled
            and cluster.get()["status"].get("phase") == "Ready"
        ),
        timeout=120,
    )
    operator.settled()  # the passes on the rolled StatefulSet have written the status
    writes = operator.metric("dsv4_api_writes_total")
    operator.more_passes(3)
    decode = cluster.children()[("StatefulSet", "dsv4-flash-decode")]
    containers = {c["name"]: c for c in decode["spec"]["template"]["spec"]["containers"]}
    assert "mesh-proxy" in containers
    assert {"name": "MESH_ENABLED", "value": "1"} in containers["engine"]["env"]
    assert operator.metric("dsv4_api_writes_total") == writes


def test_replicas_handed_to_an_autoscaler_are_left_alone(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    """With `scaling: External` another controller (an HPA) owns the decode replicas: the
    operator neither reverts them nor writes in answer."""
    _ready(cluster, **{"decode.scaling": "External"}, **NO_GUARD)
    statefulsets = cluster.dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    statefulsets.patch(
        name="dsv4-flash-decode",
        namespace=cluster.namespace,
        body={"spec": {"replicas": 2}},
        content_type="application/merge-patch+json",
        field_manager="autoscaler",
    )

    def scaled() -> bool:
        status = cluster.get()["status"]
        return bool(status.get("phase") == "Ready" and status["roles"]["decode"]["ready"] == 2)

    wait_for("two decode replicas ready and reported", scaled, timeout=120)
    writes = operator.metric("dsv4_api_writes_total")
    operator.more_passes(3)
    assert cluster.children()[("StatefulSet", "dsv4-flash-decode")]["spec"]["replicas"] == 2
    assert operator.metric("dsv4_api_writes_total") == writes


def test_compatible_update_rolls_decode_first(cluster: Cluster, operator: OperatorProcess) -> None:
    first = _ready(cluster)["status"]["currentRevision"]
    router_uid = cluster.children()[("Deployment", "dsv4-flash-router")]["metadata"]["uid"]
    router_generation = cluster.children()[("Deployment", "dsv4-flash-router")]["metadata"][
        "generation"
    ]
    writes_before = {
        kind: operator.metric("dsv4_api_writes_total", verb="patch", resource=kind) or 0
        for kind in ("statefulsets", "deployments", "services", "poddisruptionbudgets")
    }
    smaller_batches: dict[str, Any] = {"engine.maxRunningRequests": 48}
    cluster.apply(example(cluster.namespace, **smaller_batches))
    seen_prefill_before_decode = False

    def settled() -> bool:
        nonlocal seen_prefill_before_decode
        sts = cluster.children()
        pre = sts[("StatefulSet", "dsv4-flash-prefill")]["metadata"]["labels"]["dsv4.io/revision"]
        dec = sts[("StatefulSet", "dsv4-flash-decode")]["metadata"]["labels"]["dsv4.io/revision"]
        if pre != first and dec == first:
            seen_prefill_before_decode = True
        status = cluster.get().get("status", {})
        return status.get("phase") == "Ready" and status.get("currentRevision") not in (None, first)

    watch_router(cluster, settled, timeout=180)
    assert not seen_prefill_before_decode
    children = cluster.children()
    for role in ("prefill", "decode"):
        assert (
            engine_flags(children[("StatefulSet", f"dsv4-flash-{role}")])["--max-running-requests"][
                1
            ]
            == "48"
        )
    router = children[("Deployment", "dsv4-flash-router")]
    assert router["metadata"]["uid"] == router_uid  # same format: the router is untouched
    assert router["metadata"]["generation"] == router_generation
    assert len(cluster.revisions()) == 2
    # One write per object the change touches: each StatefulSet once, nothing else.
    writes = {
        kind: (operator.metric("dsv4_api_writes_total", verb="patch", resource=kind) or 0) - before
        for kind, before in writes_before.items()
    }
    assert writes == {"statefulsets": 2, "deployments": 0, "services": 0, "poddisruptionbudgets": 0}


@pytest.mark.parametrize("strategy", ["Recreate", "BlueGreen"])
def test_incompatible_update_never_mixes_formats(
    cluster: Cluster, operator: OperatorProcess, strategy: str
) -> None:
    old = _ready(cluster, **{"rollout.strategy": strategy})["status"]["currentRevision"]
    old_format = cluster.pods("dsv4.io/role=decode")[0]["metadata"]["labels"][
        "dsv4.io/transfer-format"
    ]
    cluster.apply(example(cluster.namespace, **{"rollout.strategy": strategy, **BF16}))

    def switched() -> bool:
        status = cluster.get().get("status", {})
        engines = cluster.pods("dsv4.io/role in (prefill,decode)")
        return (
            status.get("phase") == "Ready"
            and status.get("currentRevision") != old
            and status.get("observedGeneration") == 2
            and all(
                p["metadata"]["labels"]["dsv4.io/transfer-format"] != old_format for p in engines
            )
        )

    observations = watch_router(cluster, switched, timeout=240)
    assert observations > 0
    sts = {name for kind, name in cluster.children() if kind == "StatefulSet"}
    new = cluster.get()["status"]["currentRevision"]
    if strategy == "BlueGreen":
        assert sts == {f"dsv4-flash-prefill-{new}", f"dsv4-flash-decode-{new}"}
        cluster.wait_events("BlueGreenStarted", "RouterSwitched", "OldPairDeleted")
    else:
        assert sts == {"dsv4-flash-prefill", "dsv4-flash-decode"}
        cluster.wait_events("Recreate")
    for name in sts:
        env = {
            e["name"]: e["value"]
            for e in cluster.children()[("StatefulSet", name)]["spec"]["template"]["spec"][
                "containers"
            ][0]["env"]
        }
        assert env["SGLANG_DSV4_BF16_INDEX_K"] == "1"


def test_a_deleted_statefulset_is_recreated_without_touching_the_pair(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    _ready(cluster)
    before = cluster.children()
    statefulsets = cluster.dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    statefulsets.delete(name="dsv4-flash-prefill", namespace=cluster.namespace)

    def recreated() -> bool:
        sts = cluster.children().get(("StatefulSet", "dsv4-flash-prefill"))
        return (
            sts is not None
            and sts["metadata"]["uid"]
            != before[("StatefulSet", "dsv4-flash-prefill")]["metadata"]["uid"]
        )

    wait_for("the prefill StatefulSet to be recreated", recreated, timeout=60)
    cluster.wait_phase("Ready")
    after = cluster.children()
    for key in (("StatefulSet", "dsv4-flash-decode"), ("Deployment", "dsv4-flash-router")):
        assert after[key]["metadata"]["uid"] == before[key]["metadata"]["uid"], key
        assert after[key]["metadata"]["generation"] == before[key]["metadata"]["generation"]
    reasons = [e["reason"] for e in cluster.wait_events("ChildRecreated")]
    assert "Recreate" not in reasons


def test_delete_garbage_collects_children(cluster: Cluster, operator: OperatorProcess) -> None:
    _ready(cluster)
    assert cluster.children() and cluster.revisions()
    cluster.dsv4.delete(name="dsv4-flash", namespace=cluster.namespace)
    wait_for(
        "children garbage-collected",
        lambda: not cluster.children() and not cluster.revisions(),
        timeout=120,
    )


def test_invalid_update_changes_nothing(cluster: Cluster, operator: OperatorProcess) -> None:
    _ready(cluster)
    before = {k: v["metadata"]["resourceVersion"] for k, v in cluster.children().items()}
    pods_before = {p["metadata"]["uid"] for p in cluster.pods("dsv4.io/deployment=dsv4-flash")}
    overlap: dict[str, Any] = {**BF16, "engine.overlap": {"multiStream": True}}
    cluster.apply(example(cluster.namespace, **overlap))
    obj = cluster.wait_phase("Invalid")
    validated = next(c for c in obj["status"]["conditions"] if c["type"] == "Validated")
    assert validated["status"] == "False" and "DSV4-R002" in validated["message"]
    assert any(f["rule"] == "DSV4-R002" for f in obj["status"]["findings"])
    wait_for(
        "an Invalid event naming DSV4-R002",
        lambda: any(
            e["reason"] == "Invalid" and "DSV4-R002" in e["message"] for e in cluster.events()
        ),
        timeout=30,
    )
    operator.more_passes(3)  # three resyncs: still nothing rolled out, no event storm
    after = {k: v["metadata"]["resourceVersion"] for k, v in cluster.children().items()}
    assert after == before
    assert {p["metadata"]["uid"] for p in cluster.pods("dsv4.io/deployment=dsv4-flash")} == (
        pods_before
    )
    assert sum(e.get("count", 1) for e in cluster.events() if e["reason"] == "Invalid") == 1
    operator.alive_or_raise()
    cluster.apply(example(cluster.namespace))  # fixing the spec recovers
    cluster.wait_phase("Ready")


def _start_blue_green(cluster: Cluster) -> None:
    """A transfer-format change under BlueGreen, until the new pair exists."""
    cluster.apply(example(cluster.namespace, **{"rollout.strategy": "BlueGreen", **BF16}))
    wait_for(
        "the new pair to exist",
        lambda: any(
            name.startswith("dsv4-flash-decode-")
            for kind, name in cluster.children()
            if kind == "StatefulSet"
        ),
        timeout=120,
    )


def _blue_green_done(cluster: Cluster) -> str | None:
    """The new revision once it is Ready and only its pair is left."""
    status = cluster.get().get("status", {})
    new = status.get("currentRevision")
    done = (
        status.get("phase") == "Ready"
        and status.get("observedGeneration") == 2
        and {n for k, n in cluster.children() if k == "StatefulSet"}
        == {f"dsv4-flash-prefill-{new}", f"dsv4-flash-decode-{new}"}
    )
    return new if done else None


def test_operator_killed_mid_rollout_converges(
    control_plane: ControlPlane, cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    _ready(cluster, **{"rollout.strategy": "BlueGreen"})
    _start_blue_green(cluster)
    operator.kill()
    restarted = OperatorProcess(control_plane.kubeconfig_path, cluster.namespace, tmp_path).start()
    try:
        watch_router(cluster, lambda: _blue_green_done(cluster) is not None, timeout=240)
        new = _blue_green_done(cluster)
        children = set(cluster.children())
        assert children == {
            ("StatefulSet", f"dsv4-flash-prefill-{new}"),
            ("StatefulSet", f"dsv4-flash-decode-{new}"),
            ("Service", f"dsv4-flash-prefill-{new}"),
            ("Service", f"dsv4-flash-decode-{new}"),
            ("PodDisruptionBudget", f"dsv4-flash-prefill-{new}"),
            ("PodDisruptionBudget", f"dsv4-flash-decode-{new}"),
            ("Deployment", "dsv4-flash-router"),
            ("Service", "dsv4-flash-router"),
            ("PodDisruptionBudget", "dsv4-flash-router"),
        }
        assert len(cluster.revisions()) == 2
    finally:
        restarted.stop()


def _elected(
    control_plane: ControlPlane, cluster: Cluster, tmp_path: Path, replica: str
) -> OperatorProcess:
    """One replica of an operator with leader election (a 6 s Lease, to keep the test short)."""
    return OperatorProcess(
        control_plane.kubeconfig_path,
        cluster.namespace,
        tmp_path,
        DSV4_LEADER_ELECTION="true",
        DSV4_LEASE_NAMESPACE=cluster.namespace,
        DSV4_LEASE_DURATION_SECONDS="6",
        DSV4_POD_NAME=replica,
    ).start()


def _lease(cluster: Cluster) -> dict[str, Any]:
    leases = cluster.dyn.resources.get(api_version="coordination.k8s.io/v1", kind="Lease")
    spec: dict[str, Any] = leases.get(name="dsv4-operator", namespace=cluster.namespace).to_dict()[
        "spec"
    ]
    return spec


def test_leader_killed_mid_blue_green_the_standby_takes_over_alone(
    control_plane: ControlPlane, cluster: Cluster, tmp_path: Path
) -> None:
    first = _elected(control_plane, cluster, tmp_path, "replica-a")
    wait_for("replica-a to lead", lambda: first.metric("dsv4_leader") == 1, timeout=60)
    second = _elected(control_plane, cluster, tmp_path, "replica-b")
    try:
        _ready(cluster, **{"rollout.strategy": "BlueGreen"})
        _start_blue_green(cluster)
        # The standby has read everything (its cache is warm) and written nothing.
        assert second.metric("dsv4_leader") == 0
        assert second.metric("dsv4_api_writes_total") == 0
        assert second.metric("dsv4_reconciles_total") == 0
        before = _lease(cluster)
        assert before["holderIdentity"] == "replica-a"
        first.kill()
        killed = time.monotonic()
        wait_for("replica-b to take over", lambda: second.metric("dsv4_leader") == 1, timeout=60)
        print(f"failover after SIGKILL: {time.monotonic() - killed:.1f}s (lease 6 s)")
        after = _lease(cluster)
        assert after["holderIdentity"] == "replica-b"
        assert after["leaseTransitions"] == before["leaseTransitions"] + 1

        watch_router(cluster, lambda: _blue_green_done(cluster) is not None, timeout=240)
        assert len(cluster.revisions()) == 2
        # A clean stop hands the Lease over at once: the holder empties it on the way out.
        third = _elected(control_plane, cluster, tmp_path, "replica-c")
        try:
            second.stop()
            assert _lease(cluster)["holderIdentity"] in ("", "replica-c")
            wait_for("replica-c to take over", lambda: third.metric("dsv4_leader") == 1, 60)
        finally:
            third.stop()
    finally:
        first.stop()
        second.stop()


def _wait_managed_webhook(configs: Any) -> None:
    """Until kopf has written the ValidatingWebhookConfiguration `dsv4.io.validation`."""
    wait_for(
        "the managed ValidatingWebhookConfiguration",
        lambda: any(
            c["metadata"]["name"] == "dsv4.io.validation" and c.get("webhooks")
            for c in configs.get().to_dict()["items"]
        ),
        timeout=60,
    )


def test_admission_webhook_refuses_unsafe_specs(
    control_plane: ControlPlane, cluster: Cluster, tmp_path: Path
) -> None:
    """kopf serves the webhook on loopback with a self-signed cert and keeps the
    ValidatingWebhookConfiguration; the API server itself then refuses the unsafe spec. The
    self-signed key lives in the operator's temporary directory while it runs, and not after."""
    from kubernetes.dynamic.exceptions import DynamicApiError

    configs = cluster.dyn.resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingWebhookConfiguration"
    )
    temporary = tmp_path / "operator-tmp"
    temporary.mkdir()
    webhook = webhook_operator(
        control_plane.kubeconfig_path, cluster.namespace, tmp_path, TMPDIR=str(temporary)
    )
    try:
        assert sorted(p.name for p in temporary.glob("dsv4-webhook-*/*")) == ["tls.crt", "tls.key"]
        _wait_managed_webhook(configs)
        leaking: dict[str, Any] = {
            **BF16,
            "engine.hicache": {"enabled": True},
            "engine.capabilities": ["bf16IndexK"],
        }
        unsafe = example(cluster.namespace, **leaking)

        def refused() -> str | None:
            try:
                cluster.apply(unsafe)
            except DynamicApiError as error:
                return str(error.body)
            cluster.dsv4.delete(name="dsv4-flash", namespace=cluster.namespace)
            return None  # the webhook was not wired yet; try again

        message = wait_for("the API server to refuse the unsafe spec", refused, timeout=60)
        assert "DSV4-R001" in message and "spec.engine.hicache.enabled" in message
        assert "DSV4-R010" not in message  # warnings do not block admission
        cluster.apply(example(cluster.namespace))  # a sound spec is admitted
        assert cluster.get()["spec"]["engine"]["indexKDtype"] == "fp8"
        # Admitted with a warning finding: kubectl prints it as an admission warning.
        large_batches: dict[str, Any] = {"engine.maxRunningRequests": 128}
        warned = example(cluster.namespace, **large_batches)
        applied = subprocess.run(
            [
                str(tool("kubectl")),
                "--kubeconfig",
                str(control_plane.kubeconfig_path),
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager",
                "tests",
                "-f",
                "-",
            ],
            input=yaml.safe_dump(warned),
            capture_output=True,
            text=True,
            check=True,
        )
        assert "Warning: spec.engine.maxRunningRequests: [DSV4-R006]" in applied.stderr
        _hostile_input_at_the_webhook(control_plane, cluster, configs, webhook)
        _long_multi_node_name_at_the_webhook(cluster)
        webhook.stop()  # SIGTERM, as Kubernetes stops it
        assert webhook.proc is not None and webhook.proc.returncode == 0, webhook.log_tail()
        assert not list(temporary.iterdir()), "the webhook's self-signed key outlived the operator"
    finally:
        webhook.stop()
        print(f"--- webhook operator log ---\n{webhook.log_tail()}")
        for config in configs.get().to_dict()["items"]:
            if config["metadata"]["name"] == "dsv4.io.validation":
                configs.delete(name="dsv4.io.validation")


def _hostile_input_at_the_webhook(
    control_plane: ControlPlane, cluster: Cluster, configs: Any, webhook: OperatorProcess
) -> None:
    """What crashed the CLI, at the door: a 5,000-digit integer and a control character in
    a name, through `kubectl` (the API server's answer) and posted to the webhook itself (the
    AdmissionReview a broken or hostile client could send): clear refusals, no crash."""
    import base64
    import ssl

    import httpx

    huge = yaml.safe_dump(example(cluster.namespace, name="huge")).replace(
        "replicas: 1", "replicas: " + "9" * 5000, 1
    )
    kubectl = [str(tool("kubectl")), "--kubeconfig", str(control_plane.kubeconfig_path)]
    for text in (huge, yaml.safe_dump(example(cluster.namespace, name="bel\x07name"))):
        applied = subprocess.run(
            [*kubectl, "apply", "--server-side", "--field-manager", "tests", "-f", "-"],
            input=text, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert applied.returncode != 0 and "Traceback" not in applied.stderr, applied.stderr
        print(f"kubectl apply of hostile input: {applied.stderr.strip()[:300]}")
    (config,) = [c for c in configs.get().to_dict()["items"] if c["metadata"]["name"] == (
        "dsv4.io.validation")]  # fmt: skip
    client_config = config["webhooks"][0]["clientConfig"]
    context = ssl.create_default_context(
        cadata=base64.b64decode(client_config["caBundle"]).decode()
    )
    body = '{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
    body += '{"uid": "u", "object": {"spec": {"decode": {"replicas": ' + "9" * 5000 + "}}}}}"
    reply = httpx.post(
        client_config["url"], content=body, verify=context, timeout=30,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    assert reply.status_code == 400, reply.text
    assert "4300 digits" in reply.reason_phrase, reply.reason_phrase
    webhook.alive_or_raise()
    assert "Traceback" not in webhook.log_tail(200)


def _long_multi_node_name_at_the_webhook(cluster: Cluster) -> None:
    """A multi-node spec (TP16 on 8-GPU nodes) under a 30-character name, one more than its
    LeaderWorkerSets' worker StatefulSets leave: the API server refuses it through the
    webhook, naming metadata.name and the maximum (the CRD's own bound is 33)."""
    from kubernetes.dynamic.exceptions import DynamicApiError

    multi_node = {"prefill.tensorParallel": 16, "decode.tensorParallel": 16}
    with pytest.raises(DynamicApiError) as refused:
        cluster.apply(example(cluster.namespace, name="m" * 30, **multi_node))
    message = str(refused.value.body)
    assert "metadata.name" in message and "at most 29" in message, message


REPLICA_POLICY = "at most 2 replicas per StatefulSet in this namespace"


def _replica_policy(cluster: Cluster) -> Callable[[], None]:
    """A namespace policy the rules cannot know (what a cluster's policy engine enforces):
    StatefulSets here have at most 2 replicas. Returns the undo once it is in force."""
    return statefulset_policy(
        cluster.dyn, cluster.namespace, "object.spec.replicas <= 2", REPLICA_POLICY
    )


def test_a_child_the_api_server_refuses_is_reported_not_retried_in_silence(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    undo = _replica_policy(cluster)
    try:
        cluster.apply(example(cluster.namespace, **THREE_DECODES))

        def rejected() -> dict[str, Any] | None:
            obj = cluster.get()
            progressing: dict[str, Any] = next(
                (
                    c
                    for c in obj.get("status", {}).get("conditions", [])
                    if c["type"] == "Progressing"
                ),
                {},
            )
            return progressing if progressing.get("reason") == "ChildRejected" else None

        progressing = wait_for("Progressing=False ChildRejected", rejected, timeout=60)
        assert progressing["status"] == "False"
        assert REPLICA_POLICY in progressing["message"]
        assert "dsv4-flash-decode" in progressing["message"]
        events = cluster.wait_events("ChildRejected")
        assert sum(e.get("count", 1) for e in events if e["reason"] == "ChildRejected") == 1
        operator.alive_or_raise()
    finally:
        undo()
    cluster.apply(example(cluster.namespace, **THREE_DECODES))  # policy lifted
    obj = cluster.wait_phase("Ready")
    assert obj["status"]["roles"]["decode"]["replicas"] == 3


def test_admission_webhook_refuses_a_spec_whose_children_the_api_server_refuses(
    control_plane: ControlPlane, cluster: Cluster, tmp_path: Path
) -> None:
    """The rules accept the spec; the namespace's policy refuses its decode StatefulSet: the
    webhook's server-side dry run of the children refuses the spec at the door."""
    from kubernetes.dynamic.exceptions import DynamicApiError

    configs = cluster.dyn.resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingWebhookConfiguration"
    )
    undo = _replica_policy(cluster)
    webhook = webhook_operator(control_plane.kubeconfig_path, cluster.namespace, tmp_path)
    try:
        _wait_managed_webhook(configs)

        def refused() -> str | None:
            try:
                cluster.apply(example(cluster.namespace, **THREE_DECODES))
            except DynamicApiError as error:
                return str(error.body)
            cluster.dsv4.delete(name="dsv4-flash", namespace=cluster.namespace)
            return None  # the webhook was not wired yet; try again

        message = wait_for("the webhook to refuse the spec", refused, timeout=60)
        assert "StatefulSet dsv4-flash-decode" in message and REPLICA_POLICY in message
        assert "dsv4-flash-prefill" not in message  # only the refused child is named
        two_decodes: dict[str, Any] = {"decode.replicas": 2}
        cluster.apply(example(cluster.namespace, **two_decodes))  # admitted
        assert cluster.get()["spec"]["decode"]["replicas"] == 2
    finally:
        webhook.stop()
        undo()
        for config in configs.get().to_dict()["items"]:
            if config["metadata"]["name"] == "dsv4.io.validation":
                configs.delete(name="dsv4.io.validation")


def test_ready_says_why_a_pod_is_stuck(
    dyn: Any, namespace: str, gpu_pool: list[str], operator: OperatorProcess
) -> None:
    """No PVC for the weights: the scheduler's verdict, with the pod's name, is in the Ready
    condition (not only in `kubectl describe pod`); creating the PVC lets it through."""
    cluster = Cluster(dyn, namespace)  # no weights_volume() here
    cluster.apply(example(namespace))

    def explained() -> str | None:
        obj = cluster.get()
        ready: dict[str, Any] = next(
            (c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {}
        )
        message = str(ready.get("message", ""))
        return message if 'persistentvolumeclaim "dsv4-weights" not found' in message else None

    message = wait_for("the cause in the Ready condition", explained, timeout=60)
    assert "pod dsv4-flash-" in message and "Unschedulable" in message
    weights_volume(dyn, namespace)
    cluster.wait_phase("Ready")


def _ready_message(cluster: Cluster, word: str) -> str | None:
    """The Ready condition's message once it contains `word`."""
    obj = cluster.get()
    ready: dict[str, Any] = next(
        (c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {}
    )
    message = str(ready.get("message", ""))
    return message if word in message else None


def test_ready_names_a_gpu_product_no_node_has(cluster: Cluster, operator: OperatorProcess) -> None:
    """Unschedulable: the scheduler's own message, with the pod's name. Its first try may
    find the weights claim not yet bound by the volume controller ("pod has unbound immediate
    PersistentVolumeClaims"): the verdict to read is the one after."""
    cluster.apply(example(cluster.namespace, **{"gpu.product": "NVIDIA-H200"}))
    message = wait_for(
        "the scheduler's verdict on the GPU product in Ready",
        lambda: _ready_message(cluster, "node(s) didn't match"),
        timeout=30,
    )
    print(f"Ready: {message}")
    assert "pod dsv4-flash-" in message and "Unschedulable" in message
    assert "a node labelled nvidia.com/gpu.product=NVIDIA-H200 (spec.gpu.product)" in message


@pytest.mark.parametrize("cause", ["ImagePullBackOff", "CrashLoopBackOff", "FailedMount"])
def test_ready_names_what_the_kubelet_reports(
    cluster: Cluster, operator: OperatorProcess, cause: str
) -> None:
    """The kubelet's report on the engine container (written here as a kubelet would: kwok
    runs nothing) reaches the Ready condition within 30 s, with the pod's name."""
    cluster.apply(example(cluster.namespace))
    cluster.wait_phase("Ready")
    pod = "dsv4-flash-decode-0"
    wait_pod_running(cluster.dyn, cluster.namespace, pod)
    if cause == "ImagePullBackOff":
        report_container_waiting(
            cluster.dyn,
            cluster.namespace,
            pod,
            "engine",
            "ImagePullBackOff",
            'Back-off pulling image "registry.example.com/dsv4-engine:0.5.16-p3": 401 Unauthorized',
        )
        words = ["ImagePullBackOff", "401 Unauthorized"]
    elif cause == "CrashLoopBackOff":
        report_container_terminated(
            cluster.dyn,
            cluster.namespace,
            pod,
            "engine",
            reason="Error",
            exit_code=1,
            message="ValueError: --tool-call-parser deepseekv4 is not a known parser",
        )
        words = ["CrashLoopBackOff", "exit code 1", "not a known parser"]
    else:
        # Nothing in the pod's status but ContainerCreating: the cause is only in its Events
        # (posted first: the operator reads a stuck pod's Events at most once a minute).
        post_pod_warning(
            cluster,
            pod,
            "FailedMount",
            'MountVolume.SetUp failed for volume "models" : mount failed: exit status 32',
        )
        report_container_waiting(
            cluster.dyn, cluster.namespace, pod, "engine", "ContainerCreating", ""
        )
        words = ["FailedMount", 'volume "models"']
    message = wait_for(
        f"{cause} in Ready",
        lambda: _ready_message(cluster, cause),
        timeout=30,
    )
    print(f"Ready: {message}")
    assert f"pod {pod}" in message
    for word in words:
        assert word in message


def test_pod_settings_reach_the_pods_and_cause_no_write_loop(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    """What the API server adds to a user's volume or security context (defaults) is not
    drift: after Ready, passes write nothing."""
    pod_template = {
        "imagePullSecrets": [{"name": "engine-pull"}],
        "labels": {"team": "llm"},
        "annotations": {"example.com/owner": "llm-platform"},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}],
    }
    _ready(
        cluster,
        podTemplate=pod_template,
        **{"decode.podTemplate": {"labels": {"x": "y"}}},
        **NO_GUARD,
    )
    [pod] = cluster.pods("dsv4.io/role=decode")
    assert pod["metadata"]["labels"]["team"] == "llm" and pod["metadata"]["labels"]["x"] == "y"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "engine-pull"}]
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    assert {"name": "scratch", "mountPath": "/scratch"}.items() <= next(
        m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "scratch"
    ).items()
    operator.settled()  # the settling pass's status write has landed
    writes = operator.metric("dsv4_api_writes_total")
    operator.more_passes(3)
    assert operator.metric("dsv4_api_writes_total") == writes

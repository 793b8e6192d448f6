"""Multi-node roles on the real LeaderWorkerSet controller (sigs.k8s.io/lws v0.9.0, its webhooks
on) and kwok GPU nodes: the rendered groups pass the API server's dry run; DSV4-Pro with
prefill and decode each on 2 nodes x 8 H200 reaches Ready, and a transfer-format change under
BlueGreen never has the router targeting two formats (checked on every Pod watch event); a
killed worker restarts its group and the status keeps what each pod said, a worker's OOM
counts once for its group; a leaking revision of groups is rolled back to the previous groups;
a multi-node spec on a cluster without LWS says so.

These tests run on the LWS control plane (conftest `lws_control_plane`): the session's has no
LWS, on purpose, so that the tests of single-node deployments show that they need none.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from dsv4_devcluster import (
    ControlPlane,
    report_container_terminated,
    wait_for,
    wait_pod_running,
)
from dsv4_devcluster.deployments import POOL_LABEL, RTX, Cluster, example, weights_volume
from dsv4_devcluster.operator import OperatorProcess
from dsv4_devcluster.process import free_port
from dsv4_operator.engine.validation import validate_object
from dsv4_operator.names import DEPLOYMENT_LABEL, FORMAT_LABEL, ROLE_LABEL, ROUTER
from dsv4_operator.render.children import render_spec
from tests.support.builders import with_changes
from tests.support.paths import REPO

from .cluster_support import dry_run_apply
from .engine_support import KUBELET_ANNOTATIONS, ROLES, GroupEngines
from .guard_support import LEAKING, EngineKubelet, wait_good_revision_served

pytestmark = pytest.mark.integration
# Each role: TP16 over two nodes of 8 GPUs, one group per role.
TWO_NODES: dict[str, Any] = {"prefill.tensorParallel": 16, "decode.tensorParallel": 16}
BF16 = {"engine.indexKDtype": "bf16"}  # another transfer format (the example image has it)
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
PRO = "dsv4-pro"
PRO_EXAMPLE = REPO / "examples" / "dsv4-pro-pd-h200.yaml"


def _nodes(cp: ControlPlane, namespace: str, count: int, product: str) -> None:
    """`count` 8-GPU nodes of `product` for the test alone (the tests share the LWS plane: each
    pins its pods to its own nodes by a pool label)."""
    for i in range(count):
        cp.add_gpu_node(f"{namespace}-{i}", gpus=8, product=product, labels={POOL_LABEL: namespace})


@pytest.fixture
def lws_cluster(lws_control_plane: ControlPlane, lws_dyn: Any, lws_namespace: str) -> Cluster:
    """The test's namespace on the LWS control plane, with four 8-GPU RTX PRO nodes."""
    _nodes(lws_control_plane, lws_namespace, 4, RTX)
    weights_volume(lws_dyn, lws_namespace)
    return Cluster(lws_dyn, lws_namespace)


@pytest.fixture
def pro_cluster(lws_control_plane: ControlPlane, lws_dyn: Any, lws_namespace: str) -> Cluster:
    """The test's namespace on the LWS control plane, with eight 8-GPU H200 nodes (a
    BlueGreen switch of DSV4-Pro holds two pairs of two 2-node groups) and its weights claim."""
    _nodes(lws_control_plane, lws_namespace, 8, "NVIDIA-H200")
    weights_volume(lws_dyn, lws_namespace, claim="dsv4-pro-weights")
    return Cluster(lws_dyn, lws_namespace)


@pytest.fixture
def lws_operator(
    lws_control_plane: ControlPlane, lws_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(lws_control_plane.kubeconfig_path, lws_namespace, tmp_path).start()
    yield op
    op.stop()
    print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(80)}")


@pytest.fixture
def cluster_without_lws(dyn: Any, namespace: str, dsv4_crd: dict[str, Any]) -> Cluster:
    """The test's namespace on the session's plane, which has no LWS."""
    weights_volume(dyn, namespace)
    return Cluster(dyn, namespace)


def _multi_node(namespace: str, **changes: Any) -> dict[str, Any]:
    """The example with prefill and decode each on two nodes, pinned to the test's nodes."""
    pool: dict[str, Any] = {
        f"{role}.nodeSelector": {POOL_LABEL: namespace} for role in ("prefill", "decode")
    }
    return example(namespace, **TWO_NODES, **pool, **changes)


def _pro(namespace: str, **changes: Any) -> dict[str, Any]:
    """examples/dsv4-pro-pd-h200.yaml (DSV4-Pro, prefill and decode each 2 nodes x 8 H200)
    in `namespace`, pinned to the test's nodes, with `{"a.b": value}` changes."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "dsv4-pro-pd-h200.yaml").read_text())
    doc["metadata"] = {"name": PRO, "namespace": namespace}
    changes = {
        f"{r}.nodeSelector": {POOL_LABEL: namespace} for r in ("prefill", "decode")
    } | changes
    return with_changes(doc, {f"spec.{k}": v for k, v in changes.items()})


def _groups(cluster: Cluster, name: str = "dsv4-flash") -> dict[str, dict[str, Any]]:
    items = cluster.items(*LWS, f"{DEPLOYMENT_LABEL}={name}")
    return {o["metadata"]["name"]: o for o in items}


def test_every_child_of_a_multi_node_spec_passes_a_server_side_dry_run(
    lws_dyn: Any, lws_namespace: str
) -> None:
    validation = validate_object(_pro(lws_namespace))
    assert validation.valid and validation.spec is not None, validation.errors
    children = render_spec(PRO, lws_namespace, validation.spec)
    assert sum(c["kind"] == "LeaderWorkerSet" for c in children) == 2
    for child in children:
        # The LWS webhooks run on a dry run too: nothing refused, their defaults come back.
        stored = dry_run_apply(lws_dyn, lws_namespace, child)
        if child["kind"] == "LeaderWorkerSet":
            template = stored["spec"]["leaderWorkerTemplate"]
            assert template["size"] == 2
            assert template["restartPolicy"] == "RecreateGroupOnPodRestart"


class RouterWatch:
    """Every Pod watch event of a namespace, and for each one the transfer formats of the
    engine pods each router pod targets (a router pod's `--prefill`/`--decode` URLs name
    leader pods): `mixed` keeps any event after which a router targeted two formats."""

    def __init__(self, dyn: Any, namespace: str) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.events = 0
        self.mixed: list[str] = []
        self.router_checks = 0  # router pods checked, over all events
        self.restarts = 0  # watches begun again (each lists every pod again: none is missed)
        self._stop = threading.Event()
        self._watch = watch.Watch()
        self._core = dyn.resources.get(api_version="v1", kind="Pod")
        self._namespace = namespace
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RouterWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._watch.stop()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self._core.watch(
                    namespace=self._namespace, watcher=self._watch, timeout=30
                ):
                    self._seen(event["type"], event["raw_object"])
                    if self._stop.is_set():
                        return
            except (ProtocolError, ApiException):  # the stream ended or expired: watch again
                self.restarts += 1
            except TypeError:
                # The dynamic client's `watch` subscripts the None its stream yields for a
                # blank line (kubernetes 37.0.2, dynamic/client.py): the thread died mid-test
                # in CI and later events went unchecked. Watch again (a new watch lists every
                # pod again).
                self.restarts += 1

    def _seen(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self.pods.pop(name, None)
        else:
            self.pods[name] = pod
        self.events += 1
        self._check(kind, name)

    def _check(self, kind: str, name: str) -> None:
        for router in self.pods.values():
            if router["metadata"].get("labels", {}).get(ROLE_LABEL) != ROUTER:
                continue
            self.router_checks += 1
            command = router["spec"]["containers"][0]["command"]
            targets = [
                command[i + 1].split("//", 1)[1].split(".", 1)[0]
                for i, token in enumerate(command)
                if token in ("--prefill", "--decode")
            ]
            formats = {
                self.pods[t]["metadata"]["labels"][FORMAT_LABEL] for t in targets if t in self.pods
            }
            if len(formats) > 1:
                self.mixed.append(f"{kind} {name}: {router['metadata']['name']} -> {formats}")


def test_dsv4_pro_on_two_nodes_per_role_reaches_ready_and_bluegreen_never_mixes_formats(
    pro_cluster: Cluster, lws_operator: OperatorProcess
) -> None:
    cluster = pro_cluster
    started = time.monotonic()
    cluster.apply(_pro(cluster.namespace, **{"rollout.strategy": "BlueGreen"}))
    ready = cluster.wait_phase("Ready", name=PRO, timeout=240)
    created = time.monotonic() - started
    old = ready["status"]["currentRevision"]
    assert ready["status"]["roles"]["prefill"]["ready"] == 1
    groups = _groups(cluster, PRO)
    assert set(groups) == {"dsv4-pro-prefill", "dsv4-pro-decode"}
    assert not [k for k in cluster.children() if k[0] == "StatefulSet"]
    engines = cluster.pods("dsv4.io/role in (prefill,decode)")
    # Two groups of a leader and a worker, each pod on a node of its own (8 GPUs each).
    assert len(engines) == 4
    assert len({p["spec"]["nodeName"] for p in engines}) == 4
    for pod in engines:
        command = pod["spec"]["containers"][0]["command"]
        assert "--node-rank" in command
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
        # The LWS webhook injected the environment the flags read.
        env = {e["name"] for e in pod["spec"]["containers"][0].get("env", [])}
        assert {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"} <= env
    endpoints = cluster.items("discovery.k8s.io/v1", "EndpointSlice")
    served = {
        e["targetRef"]["name"]
        for s in endpoints
        if s["metadata"]["labels"].get("kubernetes.io/service-name") == "dsv4-pro-decode"
        for e in s.get("endpoints") or []
    }
    assert served == {"dsv4-pro-decode-0"}  # the leader only

    with RouterWatch(cluster.dyn, cluster.namespace) as seen:
        switch_started = time.monotonic()
        cluster.apply(_pro(cluster.namespace, **BF16, **{"rollout.strategy": "BlueGreen"}))

        def switched() -> dict[str, Any] | None:
            obj = cluster.get(PRO)
            status = obj.get("status", {})
            done = (
                status.get("phase") == "Ready"
                and status.get("observedGeneration") == 2
                and status.get("currentRevision") != old
                and len(_groups(cluster, PRO)) == 2
            )
            return obj if done else None

        new = wait_for("the BlueGreen switch of groups", switched, timeout=300)
    revision = new["status"]["currentRevision"]
    assert set(_groups(cluster, PRO)) == {
        f"dsv4-pro-prefill-{revision}",
        f"dsv4-pro-decode-{revision}",
    }
    switched_after = time.monotonic() - switch_started
    cluster.wait_events("BlueGreenStarted", "RouterSwitched", "OldPairDeleted", name=PRO)
    assert seen.events > 0 and seen.router_checks > 0
    assert seen.mixed == [], seen.mixed[:5]
    # The figures of one rollout (the closing note), shown with -s.
    print(
        f"DSV4-Pro 2x8 per role: Ready {created:.1f}s after create; BlueGreen switch "
        f"{switched_after:.1f}s, {seen.events} Pod watch events, {seen.router_checks} router "
        f"checks, 0 mixed; {len(engines)} engine pods on {len(engines)} nodes"
    )


def _leader_uid(cluster: Cluster) -> str | None:
    leaders = cluster.pods(
        "leaderworkerset.sigs.k8s.io/name=dsv4-flash-decode,"
        "leaderworkerset.sigs.k8s.io/worker-index=0"
    )
    return leaders[0]["metadata"]["uid"] if len(leaders) == 1 else None


def _last_restart(cluster: Cluster, count: int) -> dict[str, Any] | None:
    restarts = cluster.get().get("status", {}).get("groupRestarts") or []
    return restarts[-1] if len(restarts) == count else None


@pytest.mark.long(seconds=45)
def test_the_guard_reads_each_group_as_sglang_serves_it(
    lws_cluster: Cluster, lws_operator: OperatorProcess, tmp_path: Path
) -> None:
    """Every pod of both groups behind an engine double at an address of its own, a kubelet
    played for them (engine_support.GroupEngines): leaders serve the API, workers
    (`--node-rank 1`) sglang's health-only server, which has no /server_info. The guard reads
    the plan from the leaders, so PlanVerified is `Verified`, and every pod's /metrics once
    its group's leader is Ready, none unreachable."""
    cluster = lws_cluster
    changes: dict[str, Any] = {
        "guard.canary.enabled": False,
        "guard.tap.enabled": False,
        "guard.engine.interval": "1s",
        **{f"{role}.podTemplate": {"annotations": KUBELET_ANNOTATIONS} for role in ROLES},
    }
    with GroupEngines(cluster, tmp_path) as engines:
        cluster.apply(_multi_node(cluster.namespace, **changes))

        def verified() -> dict[str, Any] | None:
            found: list[dict[str, Any]] = cluster.get().get("status", {}).get("conditions", [])
            condition = next((c for c in found if c["type"] == "PlanVerified"), {})
            return condition if condition.get("reason") == "Verified" else None

        plan: dict[str, Any] = wait_for("PlanVerified Verified", verified, timeout=180)
        said = lws_operator.log_text()
        assert len(engines.addresses) == 4, engines.addresses  # two leaders, two workers
    assert plan["message"].startswith("all 2 engine pod(s) of revision"), plan
    workers = [n for n in engines.addresses if n.endswith("-0-1")]
    assert len(workers) == 2, engines.addresses
    for worker in workers:  # each ran as a group's worker: sglang's health-only server
        assert _server_args(engines.doubles[worker].log)["node_rank"] == 1
    assert "engine /metrics unreachable" not in said, said[-4000:]


def _server_args(log: str) -> dict[str, Any]:
    """What an engine double logged of its configuration as it started."""
    line = next(line for line in log.splitlines() if "server_args=" in line)
    args: dict[str, Any] = json.loads(line.split("server_args=", 1)[1])
    return args


def test_a_killed_worker_restarts_its_group_and_the_status_keeps_what_each_pod_said(
    lws_cluster: Cluster, lws_operator: OperatorProcess
) -> None:
    cluster = lws_cluster
    cluster.apply(_multi_node(cluster.namespace))
    cluster.wait_phase("Ready", timeout=240)
    leader = _leader_uid(cluster)
    worker = "dsv4-flash-decode-0-1"
    killed_uid = wait_pod_running(cluster.dyn, cluster.namespace, worker)["metadata"]["uid"]
    crash = "torch.distributed.DistBackendError: NCCL error: remote process exited"
    report_container_terminated(
        cluster.dyn, cluster.namespace, worker, "engine", reason="Error", exit_code=1, message=crash
    )
    restart = wait_for("the group restart in status", lambda: _last_restart(cluster, 1), 60)
    assert restart["group"] == "dsv4-flash-decode-0" and restart["role"] == "decode"
    assert restart["cause"] == (
        f"pod {worker} (worker 1) container engine terminated Error (exit code 1)"
    )
    pods = {p["pod"]: p for p in restart["pods"]}
    assert set(pods) == {"dsv4-flash-decode-0", worker}
    assert pods[worker]["message"] == crash and "reason" not in pods["dsv4-flash-decode-0"]
    events = cluster.wait_events("GroupRestarted")
    [event] = [e for e in events if e["reason"] == "GroupRestarted"]
    assert event["type"] == "Warning" and f"{worker}: Error: {crash}" in event["message"]
    # The LWS controller recreated the whole group (its leader too), and it serves again.
    wait_for("the decode group recreated", lambda: _leader_uid(cluster) not in (None, leader), 120)
    cluster.wait_phase("Ready", timeout=120)

    # A worker's OOM is its group's: one OOM event for the revision, kept after the restart
    # replaced the pods (no known good yet: the guard says so instead of rolling back). The
    # LWS controller makes the new worker after the new leader: wait for it, not the old one.
    def new_worker_running() -> dict[str, Any] | None:
        group = cluster.pods("leaderworkerset.sigs.k8s.io/name=dsv4-flash-decode")
        for pod in group:
            status = pod.get("status") or {}
            if pod["metadata"]["name"] == worker and pod["metadata"]["uid"] != killed_uid:
                return pod if status.get("phase") == "Running" and status.get("podIP") else None
        return None

    wait_for("the recreated worker running", new_worker_running, 120)
    report_container_terminated(cluster.dyn, cluster.namespace, worker, "engine")
    oom = wait_for("the OOM group restart", lambda: _last_restart(cluster, 2), 60)
    assert oom["pods"][1]["reason"] == "OOMKilled"

    def counted() -> dict[str, Any] | None:
        guard = cluster.get().get("status", {}).get("guard") or {}
        return guard if guard.get("oomEvents") else None

    assert wait_for("the group's OOM counted", counted, 60)["oomEvents"] == 1
    cluster.wait_events("NoKnownGood")


def test_a_multi_node_spec_on_a_cluster_without_lws_says_so_and_rolls_nothing_out(
    cluster_without_lws: Cluster, operator: OperatorProcess
) -> None:
    cluster = cluster_without_lws
    cluster.apply(example(cluster.namespace, **TWO_NODES))
    degraded = cluster.wait_phase("Degraded", timeout=60)
    conditions = {c["type"]: c for c in degraded["status"]["conditions"]}
    assert conditions["Progressing"]["reason"] == "GroupsUnavailable"
    assert "install LWS v0.9.0" in conditions["Progressing"]["message"]
    events = cluster.wait_events("GroupsUnavailable")
    [event] = [e for e in events if e["reason"] == "GroupsUnavailable"]
    assert event["type"] == "Warning"
    assert not [k for k in cluster.children() if k[0] in ("StatefulSet", "Deployment")]


def _guarded(namespace: str, endpoint: str, **changes: Any) -> dict[str, Any]:
    """The multi-node example with the guard's canary at `endpoint` (test_guard_e2e's)."""
    guard = {
        "enabled": True,
        "canary": {"sessions": 32, "rounds": 4, "interval": "2s", "endpoint": endpoint},
        "leakRate": {"threshold": 0.02, "minSamples": 30, "confidence": 0.99},
        "bakeTime": "5s",
        "errorLimit": 4,
    }
    return _multi_node(namespace, **{"guard": guard, **changes})


def _decode_group(cluster: Cluster) -> tuple[str, str] | None:
    """(revision, leader pod uid) of the main pair's decode group, once it is ready."""
    groups = _groups(cluster)
    lws = groups.get("dsv4-flash-decode")
    if lws is None or lws.get("status", {}).get("readyReplicas") != 1:
        return None
    leaders = cluster.pods(
        "leaderworkerset.sigs.k8s.io/name=dsv4-flash-decode,"
        "leaderworkerset.sigs.k8s.io/worker-index=0"
    )
    if len(leaders) != 1:
        return None
    return lws["metadata"]["labels"]["dsv4.io/revision"], leaders[0]["metadata"]["uid"]


def test_a_leaking_revision_of_groups_is_rolled_back_to_the_previous_groups(
    lws_control_plane: ControlPlane, lws_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = lws_cluster
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    engine = EngineKubelet(cluster, port, tmp_path).start()
    with (
        contextlib.ExitStack() as stack,
        OperatorProcess(
            lws_control_plane.kubeconfig_path,
            cluster.namespace,
            tmp_path,
            DSV4_CANARY_ENDPOINT_ALLOW=url,
            DSV4_MIN_CANARY_INTERVAL="1s",
        ) as operator,
    ):
        stack.callback(engine.stop)
        cluster.apply(_guarded(cluster.namespace, url))
        good = cluster.wait_baked()
        good_group = wait_for("the good decode group", lambda: _decode_group(cluster), 60)
        assert good_group[0] == good
        # The double runs the group leader's argv as a kubelet expands it.
        assert engine.running is not None and "--node-rank" in engine.running[0]
        cluster.apply(_guarded(cluster.namespace, url, **LEAKING))

        def rolled_back() -> dict[str, Any] | None:
            obj = cluster.get()
            conditions = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
            return obj if conditions.get("RolledBack", {}).get("status") == "True" else None

        obj = wait_for("the leak to be detected and rolled back", rolled_back, timeout=240)
        [entry] = obj["status"]["quarantine"]
        assert entry["reason"] == "LeakRate" and entry["hash"] != good
        wait_good_revision_served(cluster, engine, good)

        def restored() -> tuple[str, str] | None:
            group = _decode_group(cluster)
            return group if group is not None and group[0] == good else None

        # The groups of the last known good revision again (new pods: Recreate replaced them).
        revision, _ = wait_for("the good groups restored", restored, timeout=120)
        assert {g["metadata"]["labels"]["dsv4.io/revision"] for g in _groups(cluster).values()} == {
            revision
        }
        assert (operator.metric("dsv4_rollbacks_total") or 0) >= 1

"""Multi-node roles on the real LeaderWorkerSet controller (sigs.k8s.io/lws v0.9.0, its webhooks
on) and kwok GPU nodes: the rendered groups pass the API server's dry run, a deployment whose
prefill and decode each span 2 nodes x 8 GPUs reaches Ready, and a transfer-format change
under BlueGreen never has the router targeting two formats, checked on every watch event.

These tests run on a control plane of their own (this module's): the session's has no LWS, on
purpose, so that the tests of single-node deployments show that they need none.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch
from urllib3.exceptions import ProtocolError

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import POOL, POOL_LABEL, RTX, Cluster, example, weights_volume
from dsv4_devcluster.operator import OperatorProcess
from dsv4_operator.engine.validation import validate_object
from dsv4_operator.names import DEPLOYMENT_LABEL, FORMAT_LABEL, ROLE_LABEL, ROUTER
from dsv4_operator.render.children import render_spec
from tests.support.paths import CRD_PATH

from .cluster_support import new_namespace

pytestmark = pytest.mark.integration
# Each role: TP16 over two nodes of 8 GPUs, one group per role.
TWO_NODES = {"prefill.tensorParallel": 16, "decode.tensorParallel": 16}
BF16 = {"engine.indexKDtype": "bf16"}  # another transfer format (the example image has it)
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
NODES = 8  # two pairs of two groups of two pods: a BlueGreen switch holds both pairs


@pytest.fixture(scope="module")
def lws_plane() -> Iterator[ControlPlane]:
    """A control plane with kube-scheduler, kwok, the DSV4Deployment CRD and the real LWS
    controller, and eight 8-GPU RTX PRO nodes in the test pool."""
    cp = ControlPlane(with_scheduler=True, with_kwok=True, with_lws=True, crds=[CRD_PATH])
    error = ""
    try:
        cp.start()
    except Exception as exc:  # BinariesUnavailable, LwsError: fail, never skip
        error = f"could not start the dev control plane with LWS: {exc}"
    if error:
        pytest.fail(error, pytrace=False)
    try:
        for i in range(NODES):
            cp.add_gpu_node(f"mn-rtx-{i}", gpus=8, product=RTX, labels={POOL_LABEL: POOL})
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def lws_dyn(lws_plane: ControlPlane) -> Iterator[Any]:
    client = lws_plane.dynamic_client()
    try:
        yield client
    finally:
        client.client.close()


@pytest.fixture
def lws_namespace(lws_dyn: Any) -> Iterator[str]:
    with new_namespace(lws_dyn, f"mn-{uuid.uuid4().hex[:8]}") as name:
        yield name


@pytest.fixture
def lws_cluster(lws_dyn: Any, lws_namespace: str) -> Cluster:
    weights_volume(lws_dyn, lws_namespace)
    return Cluster(lws_dyn, lws_namespace)


@pytest.fixture
def lws_operator(lws_plane: ControlPlane, lws_namespace: str, tmp_path: Path) -> Iterator[Any]:
    op = OperatorProcess(lws_plane.kubeconfig_path, lws_namespace, tmp_path).start()
    yield op
    op.stop()
    print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(80)}")


def _groups(cluster: Cluster) -> dict[str, dict[str, Any]]:
    items = cluster.items(*LWS, f"{DEPLOYMENT_LABEL}=dsv4-flash")
    return {o["metadata"]["name"]: o for o in items}


def test_every_child_of_a_multi_node_spec_passes_a_server_side_dry_run(
    lws_dyn: Any, lws_namespace: str
) -> None:
    doc = example(lws_namespace, **TWO_NODES)
    validation = validate_object(doc)
    assert validation.valid and validation.spec is not None, validation.errors
    children = render_spec("dsv4-flash", lws_namespace, validation.spec)
    assert sum(c["kind"] == "LeaderWorkerSet" for c in children) == 2
    for child in children:
        resource = lws_dyn.resources.get(api_version=child["apiVersion"], kind=child["kind"])
        # The LWS webhooks run on a dry run too: their defaults come back, nothing refused.
        answer = resource.server_side_apply(
            body=child,
            name=child["metadata"]["name"],
            namespace=lws_namespace,
            field_manager="dry-run-check",
            query_params=[("dryRun", "All")],
        ).to_dict()
        if child["kind"] == "LeaderWorkerSet":
            template = answer["spec"]["leaderWorkerTemplate"]
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
            except ProtocolError:  # the stream ended (stopped, or the server closed it)
                continue

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


def test_two_nodes_per_role_reach_ready_and_a_bluegreen_switch_never_mixes_formats(
    lws_cluster: Cluster, lws_operator: Any
) -> None:
    cluster = lws_cluster
    cluster.apply(example(cluster.namespace, **TWO_NODES, **{"rollout.strategy": "BlueGreen"}))
    ready = cluster.wait_phase("Ready", timeout=240)
    old = ready["status"]["currentRevision"]
    assert ready["status"]["roles"]["prefill"]["ready"] == 1
    groups = _groups(cluster)
    assert set(groups) == {"dsv4-flash-prefill", "dsv4-flash-decode"}
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
        if s["metadata"]["labels"].get("kubernetes.io/service-name") == "dsv4-flash-decode"
        for e in s.get("endpoints") or []
    }
    assert served == {"dsv4-flash-decode-0"}  # the leader only

    with RouterWatch(cluster.dyn, cluster.namespace) as seen:
        cluster.apply(
            example(cluster.namespace, **TWO_NODES, **BF16, **{"rollout.strategy": "BlueGreen"})
        )

        def switched() -> dict[str, Any] | None:
            obj = cluster.get()
            status = obj.get("status", {})
            done = (
                status.get("phase") == "Ready"
                and status.get("observedGeneration") == 2
                and status.get("currentRevision") != old
                and len(_groups(cluster)) == 2
            )
            return obj if done else None

        new = wait_for("the BlueGreen switch of groups", switched, timeout=300)
    revision = new["status"]["currentRevision"]
    assert set(_groups(cluster)) == {
        f"dsv4-flash-prefill-{revision}",
        f"dsv4-flash-decode-{revision}",
    }
    cluster.wait_events("BlueGreenStarted", "RouterSwitched", "OldPairDeleted")
    assert seen.events > 0 and seen.router_checks > 0
    assert seen.mixed == [], seen.mixed[:5]

"""The Helm chart against the real API server: `helm install`, the chart's RBAC proven by
running the operator with a token of the chart's ServiceAccount, and the webhook wiring.

The operator pod the chart creates is Running on a kwok node, but nothing executes there, so
the operator that reconciles is `dsv4 run` on this machine with the chart ServiceAccount's
credentials (TokenRequest API -> kubeconfig): every request it makes is authorized by the RBAC
the chart rendered, and nothing else. Here the kwok pods' IPs are made up, so the API server
cannot reach the webhook through the Service; the webhook objects are checked by comparison
with what kopf creates, and the served certificate and path by calling the operator's webhook
over TLS with the chart's CA and the Service's DNS name. `test_chart_ha.py` gives the replicas
real addresses and lets the API server call them through the Service.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from dsv4_devcluster import ControlPlane, report_container_waiting, wait_for, wait_pod_running
from dsv4_devcluster.deployments import (
    POOL_LABEL,
    RTX,
    Cluster,
    example,
    volume_for,
    weights_volume,
)
from dsv4_devcluster.hub import HubRepo, StandInHub
from dsv4_devcluster.operator import OperatorProcess, webhook_operator
from dsv4_devcluster.process import free_port
from tests.support.paths import REPO

from ..chart.support import CHART, render, tool
from .cluster_support import post_pod_warning, service_account_kubeconfig
from .helm_support import Helm
from .weights_support import JobContainer

pytestmark = pytest.mark.integration
POOL = "chart"  # this module's own fake GPU nodes
# An RBAC denial, as the API server words it and as kopf reports a missing permission.
DENIED = re.compile(r"cannot \w+ resource|Not enough permissions|is forbidden: User", re.I)


# prometheus-operator's ServiceMonitor type, schema-less: enough for the operator to apply one.
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "plural": "servicemonitors",
            "singular": "servicemonitor",
            "kind": "ServiceMonitor",
            "listKind": "ServiceMonitorList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def chart_nodes(control_plane: ControlPlane, dsv4_crd: dict[str, Any], dyn: Any) -> list[str]:
    """This module's kwok GPU nodes, and the ServiceMonitor type (spec.monitoring)."""
    names = [f"chart-rtx-{i}" for i in range(2)]
    for name in names:
        control_plane.add_gpu_node(name, gpus=8, product=RTX, labels={POOL_LABEL: POOL})
    crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    crd_name = SERVICE_MONITOR_CRD["metadata"]["name"]  # type: ignore[index]
    crds.server_side_apply(body=SERVICE_MONITOR_CRD, name=crd_name, field_manager="dsv4-tests")

    def served() -> bool:
        try:
            dyn.resources.get(api_version="monitoring.coreos.com/v1", kind="ServiceMonitor")
        except Exception:
            dyn.resources.invalidate_cache()
            return False
        return True

    wait_for("ServiceMonitor served", served, timeout=60)
    return names


@pytest.fixture(scope="module")
def helm(control_plane: ControlPlane) -> Helm:
    return Helm(control_plane.kubeconfig_path)


def _values(**values: Any) -> dict[str, Any]:
    """Chart values for the dev cluster: the operator pod goes to this module's kwok nodes; the
    CRD is the control plane's own (installed at start, so no release owns it)."""
    return {"nodeSelector": {POOL_LABEL: POOL}, "crds": {"enabled": False}, **values}


def _denials(op: OperatorProcess) -> list[str]:
    text = op.log_text()
    return [line for line in text.splitlines() if DENIED.search(line)]


def _who_am_i(kubeconfig: Path) -> str:
    out = subprocess.run(
        [str(tool("kubectl")), "--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    username: str = json.loads(out)["status"]["userInfo"]["username"]
    return username


def _wait_ready(cluster: Cluster, op: OperatorProcess, timeout: float = 180) -> dict[str, Any]:
    """Phase Ready for the current generation; fails at once on an RBAC denial in the log."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        denials = _denials(op)
        if denials:
            pytest.fail("the chart's RBAC denied the operator:\n" + "\n".join(denials[:5]))
        op.alive_or_raise()
        obj = cluster.get()
        status = obj.get("status", {})
        generation = obj["metadata"]["generation"]
        if status.get("phase") == "Ready" and status.get("observedGeneration") == generation:
            return obj
        time.sleep(0.3)
    raise TimeoutError(f"not Ready after {timeout}s: {status.get('conditions')}")


def _lifecycle(cluster: Cluster, op: OperatorProcess) -> None:
    """Every kind of write the operator makes: create, a ServiceMonitor, a transfer-format
    change with Recreate (deletes StatefulSets and the router Deployment), one with BlueGreen
    (deletes the old pair's Services and PodDisruptionBudgets too), revision pruning (history
    limit 1), Events and status; then delete."""
    doc = example(cluster.namespace)
    for role in ("prefill", "decode"):
        doc["spec"][role]["nodeSelector"] = {POOL_LABEL: POOL}
    cluster.apply(doc)
    first = _wait_ready(cluster, op)
    assert cluster.children(), "no children were created"
    doc["spec"]["monitoring"] = {"serviceMonitor": {"enabled": True}}
    cluster.apply(doc)
    _wait_ready(cluster, op)
    monitors = cluster.items("monitoring.coreos.com/v1", "ServiceMonitor")
    assert [m["metadata"]["name"] for m in monitors] == ["dsv4-flash"]
    doc["spec"]["engine"]["indexKDtype"] = "bf16"
    cluster.apply(doc)
    second = _wait_ready(cluster, op)
    assert second["status"]["currentRevision"] != first["status"]["currentRevision"]
    doc["spec"]["engine"]["indexKDtype"] = "fp8"
    doc["spec"]["rollout"] = {"strategy": "BlueGreen"}
    cluster.apply(doc)
    third = _wait_ready(cluster, op)
    assert third["status"]["currentRevision"] == first["status"]["currentRevision"]
    names = {name for _, name in cluster.children()}
    assert "dsv4-flash-prefill" not in names, "BlueGreen deleted the old pair"
    wait_for("revisions pruned to the limit", lambda: len(cluster.revisions()) == 1, timeout=30)
    assert any(e["reason"] for e in cluster.events()), "no Events were posted"
    # Its series exist (every pass sets them): their retirement is what shows, after the
    # delete, that the operator saw it.
    assert op.series("dsv4_guard_outcome"), "no dsv4_guard_outcome series before the delete"
    cluster.dsv4.delete(name="dsv4-flash", namespace=cluster.namespace)
    wait_for("children garbage-collected", lambda: not cluster.children(), timeout=120)


def _prove_rbac(
    control_plane: ControlPlane,
    dyn: Any,
    work: str,
    sa_namespace: str,
    sa_name: str,
    tmp_path: Path,
    watch: str,
) -> None:
    kubeconfig = service_account_kubeconfig(
        control_plane, sa_namespace, sa_name, tmp_path / "sa.kubeconfig"
    )
    assert _who_am_i(kubeconfig) == f"system:serviceaccount:{sa_namespace}:{sa_name}"
    weights_volume(dyn, work)
    # Leader election on, as the chart runs it: the Lease's Role is exercised too.
    op = OperatorProcess(
        kubeconfig,
        work,
        tmp_path,
        DSV4_NAMESPACES=watch,
        DSV4_REVISION_HISTORY_LIMIT="1",
        DSV4_LEADER_ELECTION="true",
        DSV4_LEASE_NAMESPACE=sa_namespace,
        DSV4_LEASE_NAME=sa_name,
        DSV4_LEASE_OWNER=sa_name,  # the chart's Deployment, named as its ServiceAccount
    ).start()
    try:
        _lifecycle(Cluster(dyn, work), op)
        # The deletion reached the operator (the deployment's series retired) and it goes on,
        # its watches still authorized (a denial would be in its log, read below). Not passes:
        # a deleted deployment's key leaves the work queue, and nothing is left to resync.
        wait_for(
            "the deleted deployment's series retired",
            lambda: not op.series("dsv4_guard_outcome"),
            timeout=60,
        )
        op.alive_or_raise()
    finally:
        op.stop()
        print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(80)}")
    denials = _denials(op)
    assert not denials, "the chart's RBAC denied the operator:\n" + "\n".join(denials[:20])


def _namespaced(helm: Helm, release: str, namespace: str, work_namespace: str) -> Any:
    """The chart installed to watch `work_namespace` only, without its webhook."""
    values = _values(watchNamespaces=[work_namespace], webhook={"enabled": False})
    return helm.installed(release, namespace, values)


def test_namespaced_rbac_lets_the_operator_reconcile_and_nothing_is_denied(
    control_plane: ControlPlane,
    dyn: Any,
    helm: Helm,
    namespace: str,
    work_namespace: str,
    chart_nodes: list[str],
    tmp_path: Path,
) -> None:
    release = "dsv4-ns"
    with _namespaced(helm, release, namespace, work_namespace):
        rbac = k8s.RbacAuthorizationV1Api(control_plane.api_client())
        roles = rbac.list_namespaced_role(work_namespace).items
        assert sorted(r.metadata.name for r in roles if r.metadata and r.metadata.name) == [
            f"{release}-dsv4-operator",
            f"{release}-dsv4-operator-test-dry-run",  # the `helm test` pod's dry runs
        ]
        _prove_rbac(
            control_plane,
            dyn,
            work_namespace,
            namespace,
            f"{release}-dsv4-operator",
            tmp_path,
            watch=work_namespace,
        )


def test_cluster_wide_rbac_lets_the_operator_reconcile_and_nothing_is_denied(
    control_plane: ControlPlane,
    dyn: Any,
    helm: Helm,
    namespace: str,
    work_namespace: str,
    chart_nodes: list[str],
    tmp_path: Path,
) -> None:
    release = "dsv4-cw"
    helm.install(release, namespace, _values(webhook={"enabled": False}))
    try:
        _prove_rbac(
            control_plane,
            dyn,
            work_namespace,
            namespace,
            f"{release}-dsv4-operator",
            tmp_path,
            watch="",
        )
    finally:
        helm.uninstall(release, namespace)


def _ready_condition(cluster: Cluster) -> dict[str, Any]:
    conditions = cluster.get().get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "Ready"), {})


def _forbid_listing_events(dyn: Any, role_name: str, namespace: str) -> None:
    """Take `list` off the Role's Events rule (posting them stays granted)."""
    roles = dyn.resources.get(api_version="rbac.authorization.k8s.io/v1", kind="Role")
    rules = roles.get(name=role_name, namespace=namespace).to_dict()["rules"]
    [events] = [r for r in rules if r.get("resources") == ["events"]]
    assert "list" in events["verbs"]
    events["verbs"] = [v for v in events["verbs"] if v != "list"]
    roles.patch(
        name=role_name,
        namespace=namespace,
        body={"rules": rules},
        content_type="application/merge-patch+json",
    )


def _nudge(cluster: Cluster, op: OperatorProcess, value: str) -> None:
    """A watch event for the deployment (an annotation changed), and the pass it brings."""
    target = op.passes() + 1
    cluster.dsv4.patch(
        name="dsv4-flash",
        namespace=cluster.namespace,
        body={"metadata": {"annotations": {"test.dsv4.io/nudge": value}}},
        content_type="application/merge-patch+json",
    )
    wait_for("a pass", lambda: op.passes() >= target, timeout=30)


def _stuck_pod_without_its_events(cluster: Cluster, op: OperatorProcess) -> None:
    """A pod whose cause only a Warning Event tells: Ready says the role is short and no more,
    the operator says once that it cannot list Events, and no pass fails."""
    doc = example(cluster.namespace)
    for role in ("prefill", "decode"):
        doc["spec"][role]["nodeSelector"] = {POOL_LABEL: POOL}
    cluster.apply(doc)
    cluster.wait_phase("Ready")
    pod = "dsv4-flash-decode-0"
    wait_pod_running(cluster.dyn, cluster.namespace, pod)
    # The pod's status says ContainerCreating; only its Event says why.
    post_pod_warning(cluster, pod, "FailedMount", 'MountVolume.SetUp failed: volume "models"')
    report_container_waiting(cluster.dyn, cluster.namespace, pod, "engine", "ContainerCreating", "")

    def not_ready() -> dict[str, Any] | None:
        condition = _ready_condition(cluster)
        short = "decode 0/1" in condition.get("message", "")
        return condition if condition.get("status") == "False" and short else None

    print(f"Ready: {wait_for('the decode pod not ready, in Ready', not_ready, timeout=60)}")
    told = "cannot list Events (RBAC)"
    wait_for(told, lambda: told in op.log_text(), timeout=60)
    for nudge in range(3):  # passes for the stuck pod again
        _nudge(cluster, op, str(nudge))
    op.alive_or_raise()
    ready = _ready_condition(cluster)
    assert "FailedMount" not in ready["message"], ready  # the Event was never read
    assert op.log_text().count(told) == 1, "told more than once"
    # Counted as sent (refused or not): one listing, none after the 403.
    listed = op.metric("dsv4_api_reads_total", verb="list", resource="events")
    assert listed == 1, f"Events listed {listed} times"
    assert not op.metric("dsv4_reconciles_total", result="error"), "a pass failed"


def test_without_the_right_to_list_events_causes_come_from_pod_status_and_nothing_fails(
    control_plane: ControlPlane,
    dyn: Any,
    helm: Helm,
    namespace: str,
    work_namespace: str,
    chart_nodes: list[str],
    tmp_path: Path,
) -> None:
    """A hardened cluster whose admins grant the operator no `list` on Events: a stuck pod's
    cause then comes from its status alone (no Warning Event is read), the operator says so
    once in its log, and its passes neither fail nor retry the listing."""
    release = "dsv4-noev"
    with _namespaced(helm, release, namespace, work_namespace):
        account = f"{release}-dsv4-operator"
        _forbid_listing_events(dyn, account, work_namespace)
        kubeconfig = service_account_kubeconfig(
            control_plane, namespace, account, tmp_path / "sa.kubeconfig"
        )
        weights_volume(dyn, work_namespace)
        op = OperatorProcess(kubeconfig, work_namespace, tmp_path, DSV4_NAMESPACES=work_namespace)
        try:
            with op:
                _stuck_pod_without_its_events(Cluster(dyn, work_namespace), op)
        finally:
            print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(60)}")


LWS_KINDS = (("leaderworkerset.x-k8s.io", "leaderworkersets"),)
# The operator renders one LeaderWorkerSet per multi-node role, never a DisaggregatedSet
# (docs/multinode.md): the chart grants nothing on them.
UNUSED_LWS_KINDS = (("disaggregatedset.x-k8s.io", "disaggregatedsets"),)


def sa_may(
    cp: ControlPlane, user: str, verb: str, group: str, resource: str, namespace: str
) -> bool:
    """The API server's authorizer on whether ``user`` may ``verb`` the resource (a
    SubjectAccessReview: works for types the server does not serve)."""
    dyn = cp.dynamic_client()
    try:
        reviews = dyn.resources.get(
            api_version="authorization.k8s.io/v1", kind="SubjectAccessReview"
        )
        attributes = {"verb": verb, "group": group, "resource": resource, "namespace": namespace}
        review = reviews.create(
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {"user": user, "resourceAttributes": attributes},
            }
        ).to_dict()
    finally:
        dyn.client.close()
    return bool(review["status"].get("allowed"))


def test_the_service_account_cannot_do_more_than_the_chart_grants(
    control_plane: ControlPlane,
    helm: Helm,
    namespace: str,
    work_namespace: str,
    chart_nodes: list[str],
    tmp_path: Path,
) -> None:
    """Negative control: the same token is refused what the chart does not grant."""
    release = "dsv4-neg"
    with _namespaced(helm, release, namespace, work_namespace):
        kubeconfig = service_account_kubeconfig(
            control_plane, namespace, f"{release}-dsv4-operator", tmp_path / "sa.kubeconfig"
        )

        def can_i(*args: str) -> bool:
            proc = subprocess.run(
                [str(tool("kubectl")), "--kubeconfig", str(kubeconfig), "auth", "can-i", *args],
                capture_output=True,
                text=True,
                check=False,
            )
            return proc.stdout.strip() == "yes"

        assert can_i("patch", "statefulsets.apps", "-n", work_namespace)
        assert can_i(
            "patch", "dsv4deployments.dsv4.io", "--subresource=status", "-n", work_namespace
        )
        assert can_i("watch", "customresourcedefinitions.apiextensions.k8s.io")
        assert not can_i("patch", "statefulsets.apps", "-n", "default")  # not a watched namespace
        # Multi-node roles' LWS groups, granted whether or not LWS is installed. It is not
        # here, and kubectl answers "no" for a type the server does not serve without asking:
        # ask the authorizer directly.
        user = f"system:serviceaccount:{namespace}:{release}-dsv4-operator"
        for group, resource in LWS_KINDS:
            assert sa_may(control_plane, user, "patch", group, resource, work_namespace)
            assert sa_may(control_plane, user, "watch", group, resource, work_namespace)
            assert not sa_may(control_plane, user, "patch", group, resource, "default")
        for group, resource in UNUSED_LWS_KINDS:
            assert not sa_may(control_plane, user, "patch", group, resource, work_namespace)
        # A Secret by name (the Hub token's existence, read as metadata), never listed or
        # watched: the operator cannot enumerate the namespace's Secrets.
        assert can_i("get", "secrets", "-n", work_namespace)
        assert not can_i("list", "secrets", "-n", work_namespace)
        assert not can_i("watch", "secrets", "-n", work_namespace)
        assert not can_i("create", "pods", "-n", work_namespace)
        assert not can_i("update", "dsv4deployments.dsv4.io", "-n", work_namespace)
        assert not can_i("delete", "customresourcedefinitions.apiextensions.k8s.io")


def test_namespace_users_get_dsv4_rights_through_the_default_roles(
    control_plane: ControlPlane,
    dyn: Any,
    helm: Helm,
    namespace: str,
    work_namespace: str,
) -> None:
    """`edit` and `view` bound in a namespace carry the chart's aggregated rules (the
    controller-manager's clusterrole-aggregation controller folds them in)."""
    release = "dsv4-users"
    helm.install(release, namespace, _values(webhook={"enabled": False}))
    bindings = dyn.resources.get(api_version="rbac.authorization.k8s.io/v1", kind="RoleBinding")
    for user, role in (("alice", "edit"), ("bob", "view")):
        bindings.create(
            namespace=work_namespace,
            body={
                "metadata": {"name": f"{user}-{role}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                ],
            },
        )

    def can(user: str, *args: str, namespace: str = work_namespace) -> bool:
        proc = subprocess.run(
            [
                str(tool("kubectl")),
                "--kubeconfig",
                str(control_plane.kubeconfig_path),
                "auth",
                "can-i",
                "--as",
                user,
                "-n",
                namespace,
                *args,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.stdout.strip() == "yes"

    try:
        wait_for(
            "the edit role to carry the DSV4Deployment rules",
            lambda: can("alice", "create", "dsv4deployments.dsv4.io"),
            timeout=60,
        )
        assert can("alice", "delete", "dsv4deployments.dsv4.io")
        assert not can("alice", "patch", "dsv4deployments.dsv4.io", "--subresource=status")
        wait_for(
            "the view role to carry the DSV4Deployment rules",
            lambda: can("bob", "list", "dsv4deployments.dsv4.io"),
            timeout=60,
        )
        assert not can("bob", "create", "dsv4deployments.dsv4.io")
        assert not can("bob", "list", "dsv4deployments.dsv4.io", namespace="default")
    finally:
        helm.uninstall(release, namespace)


def test_helm_install_brings_up_the_operator_with_a_working_webhook_certificate(
    control_plane: ControlPlane,
    dyn: Any,
    helm: Helm,
    namespace: str,
    chart_nodes: list[str],
    tmp_path: Path,
) -> None:
    """Install (webhook on, Helm-generated certificate): the Deployment becomes available on a
    kwok node; upgrade keeps the certificate; the operator, run with that certificate and the
    chart's ServiceAccount, serves the admission review at the path the configuration names,
    verifiable with the configuration's caBundle for the Service's DNS name.

    The release watches only its own namespace, where no DSV4Deployment is ever created, so the
    API server never calls the webhook Service."""
    release = "dsv4-op"
    helm.install(
        release, namespace, _values(watchNamespaces=[namespace]), "--wait", "--timeout", "3m"
    )
    try:
        apps = k8s.AppsV1Api(control_plane.api_client())
        core = k8s.CoreV1Api(control_plane.api_client())
        deployment = apps.read_namespaced_deployment(f"{release}-dsv4-operator", namespace)
        assert deployment.status is not None and deployment.spec is not None
        assert deployment.status.available_replicas == 2
        assert deployment.spec.strategy is not None
        assert deployment.spec.strategy.type == "RollingUpdate"
        pods = core.list_namespaced_pod(
            namespace, label_selector=f"app.kubernetes.io/instance={release}"
        ).items
        assert [p.status.phase if p.status else None for p in pods] == ["Running", "Running"]
        # Anti-affinity: the two replicas on different nodes (the module has several).
        nodes = {p.spec.node_name if p.spec else None for p in pods}
        assert len(nodes) == 2 and nodes <= set(chart_nodes)

        secret_name = f"{release}-dsv4-operator-webhook-tls"
        secret = core.read_namespaced_secret(secret_name, namespace).data
        assert secret is not None
        admission = k8s.AdmissionregistrationV1Api(control_plane.api_client())
        config = admission.read_validating_webhook_configuration(f"{release}-dsv4-operator")
        assert config.webhooks
        webhook = config.webhooks[0]
        service, ca_bundle = webhook.client_config.service, webhook.client_config.ca_bundle
        assert service is not None and service.path is not None and ca_bundle is not None
        assert base64.b64decode(ca_bundle) == base64.b64decode(secret["ca.crt"])
        helm("upgrade", release, CHART, "-n", namespace, "--reset-then-reuse-values")
        assert core.read_namespaced_secret(secret_name, namespace).data == secret, (
            "helm upgrade must keep the webhook certificate (lookup)"
        )

        cert_dir = tmp_path / "webhook-tls"
        cert_dir.mkdir()
        for key in ("tls.crt", "tls.key"):
            (cert_dir / key).write_bytes(base64.b64decode(secret[key]))
        kubeconfig = service_account_kubeconfig(
            control_plane, namespace, f"{release}-dsv4-operator", tmp_path / "sa.kubeconfig"
        )
        port, health = free_port(), free_port()
        op = OperatorProcess(
            kubeconfig,
            namespace,
            tmp_path,
            DSV4_WEBHOOK="1",
            DSV4_LISTEN_HOST="127.0.0.1",
            DSV4_WEBHOOK_PORT=str(port),
            DSV4_WEBHOOK_CERT_DIR=str(cert_dir),
            DSV4_HEALTH_PORT=str(health),
        ).start()
        try:
            path = service.path
            host = f"{service.name}.{namespace}.svc"
            ca = base64.b64decode(ca_bundle).decode()
            leaking: dict[str, Any] = {
                "engine.indexKDtype": "bf16",
                "engine.hicache": {"enabled": True},
                "engine.capabilities": ["bf16IndexK"],
            }
            unsafe = example(namespace, **leaking)
            refused = wait_for(
                "the operator's webhook server",
                lambda: _try_review(port, path, host, ca, unsafe),
                timeout=60,
            )
            assert refused["allowed"] is False
            assert "DSV4-R001" in refused["status"]["message"]
            assert _review(port, path, host, ca, example(namespace))["allowed"] is True
            # The probes' endpoint answers on the health port.
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=5) as r:
                assert r.status == 200
        finally:
            op.stop()
            print(f"--- operator log ---\n{op.log_tail(60)}")
        assert not _denials(op), _denials(op)
    finally:
        helm.uninstall(release, namespace)
    admission = k8s.AdmissionregistrationV1Api(control_plane.api_client())
    configs = admission.list_validating_webhook_configuration().items
    names = [c.metadata.name for c in configs if c.metadata is not None]
    assert f"{release}-dsv4-operator" not in names, "helm uninstall leaves no webhook behind"


def _try_review(
    port: int, path: str, host: str, ca: str, obj: dict[str, Any]
) -> dict[str, Any] | None:
    try:
        return _review(port, path, host, ca, obj)
    except ConnectionRefusedError:
        return None  # not listening yet


def _review(port: int, path: str, host: str, ca: str, obj: dict[str, Any]) -> dict[str, Any]:
    """POST an AdmissionReview like the API server does: TLS verified with the caBundle for
    the Service's DNS name."""
    context = ssl.create_default_context(cadata=ca)
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000001",
            "kind": {"group": "dsv4.io", "version": "v1alpha1", "kind": "DSV4Deployment"},
            "resource": {"group": "dsv4.io", "version": "v1alpha1", "resource": "dsv4deployments"},
            "requestKind": {"group": "dsv4.io", "version": "v1alpha1", "kind": "DSV4Deployment"},
            "requestResource": {
                "group": "dsv4.io",
                "version": "v1alpha1",
                "resource": "dsv4deployments",
            },
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "tests"},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": None,
        },
    }
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    # Verify the certificate for the Service's name while connecting to loopback.
    connection.sock = context.wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname=host
    )
    connection.request(
        "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    assert response.status == 200, response.read()
    review: dict[str, Any] = json.loads(response.read())["response"]
    connection.close()
    return review


def test_chart_webhook_configuration_matches_what_kopf_creates(
    control_plane: ControlPlane, dyn: Any, namespace: str, tmp_path: Path
) -> None:
    """kopf, managing the configuration itself (a local run), and the chart agree on every
    field but where the webhook is (a URL there, the chart's Service here)."""
    configs = dyn.resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingWebhookConfiguration"
    )
    op = webhook_operator(control_plane.kubeconfig_path, namespace, tmp_path)
    try:
        kopf_config = wait_for(
            "kopf's ValidatingWebhookConfiguration",
            lambda: next(
                (
                    c
                    for c in configs.get().to_dict()["items"]
                    if c["metadata"]["name"] == "dsv4.io.validation" and c.get("webhooks")
                ),
                None,
            ),
            timeout=60,
        )
    finally:
        op.stop()
        for config in configs.get().to_dict()["items"]:
            if config["metadata"]["name"] == "dsv4.io.validation":
                configs.delete(name="dsv4.io.validation")
    chart_config = next(
        o
        for o in render({"webhook": {"timeoutSeconds": 30}})
        if o["kind"] == "ValidatingWebhookConfiguration"
    )
    (theirs,) = kopf_config["webhooks"]
    (ours,) = chart_config["webhooks"]
    kopf_url = theirs.pop("clientConfig")["url"]
    our_client = ours.pop("clientConfig")
    assert kopf_url.endswith(our_client["service"]["path"])
    # Empty selectors are what the API server stores for "none".
    for selector in ("namespaceSelector", "objectSelector"):
        assert theirs.pop(selector, {}) == ours.pop(selector, {}) == {}
    assert ours == theirs


def test_the_readme_install_with_weights_from_the_hub_reaches_ready(
    control_plane: ControlPlane,
    dyn: Any,
    helm: Helm,
    namespace: str,
    work_namespace: str,
    chart_nodes: list[str],
    tmp_path: Path,
) -> None:
    """README "Install in a cluster", steps 2 and 3, as a user runs them: helm install, then
    examples/dsv4-hub.yaml (namespace, node pool and Hub endpoint changed: the stand-in Hub
    serves a small repo under the example's name). The operator runs with the chart's RBAC
    and the chart's DSV4_OPERATOR_IMAGE; the Job's container runs here (kwok runs nothing)."""
    release = "dsv4-readme"
    helm.install(release, namespace, _values(webhook={"enabled": False}))
    try:
        deployment = (
            dyn.resources.get(api_version="apps/v1", kind="Deployment")
            .get(name=f"{release}-dsv4-operator", namespace=namespace)
            .to_dict()
        )
        env = {
            e["name"]: e.get("value")
            for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        assert env["DSV4_OPERATOR_IMAGE"] == image
        kubeconfig = service_account_kubeconfig(
            control_plane, namespace, f"{release}-dsv4-operator", tmp_path / "sa.kubeconfig"
        )
        doc = yaml.safe_load((REPO / "examples" / "dsv4-hub.yaml").read_text())
        name = doc["metadata"]["name"]
        assert name == "dsv4-flash"  # the name _wait_ready and Cluster read
        doc["metadata"]["namespace"] = work_namespace
        for role in ("prefill", "decode"):
            doc["spec"][role]["nodeSelector"] = {POOL_LABEL: POOL}
        files = {"config.json": b"{}", "model-00001-of-00001.safetensors": b"w" * 300_000}
        with StandInHub({doc["spec"]["model"]["name"]: HubRepo(files)}) as hub:
            doc["spec"]["model"]["cache"]["huggingFace"]["endpoint"] = hub.endpoint
            volume_for(
                dyn,
                work_namespace,
                f"{name}-weights",
                access_modes=("ReadWriteOnce",),
                capacity="2Ti",
            )
            op = OperatorProcess(
                kubeconfig, work_namespace, tmp_path, DSV4_NAMESPACES="", DSV4_OPERATOR_IMAGE=image
            ).start()
            cluster = Cluster(dyn, work_namespace)
            try:
                cluster.apply(doc)
                jobs = wait_for(  # of the DSV4Model named after the deployment
                    "the download Job",
                    lambda: cluster.items("batch/v1", "Job", f"dsv4.io/model={name}"),
                    timeout=60,
                )
                assert jobs[0]["spec"]["template"]["spec"]["containers"][0]["image"] == image
                claim_dir = tmp_path / "claim"
                claim_dir.mkdir()
                attempt = JobContainer(control_plane, work_namespace, jobs[0], claim_dir, tmp_path)
                assert attempt.start().finish() == 0
                ready = _wait_ready(cluster, op)
                weights = next(
                    c for c in ready["status"]["conditions"] if c["type"] == "WeightsReady"
                )
                print(f"WeightsReady: {weights['message']}")
                assert weights["status"] == "True"
            finally:
                op.stop()
                print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(60)}")
            denials = _denials(op)
            assert not denials, "the chart's RBAC denied the operator:\n" + "\n".join(denials)
    finally:
        helm.uninstall(release, namespace)

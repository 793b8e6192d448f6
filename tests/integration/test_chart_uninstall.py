"""Day 2 with the chart against the real API server. `helm uninstall` leaves only what
docs/install.md says it keeps (the CRD): no `helm test` pod, no test RBAC, and no
leader-election Lease (the Lease names the operator's Deployment as its owner; the garbage
collector deletes it with the Deployment). With the webhook off, `helm test` checks what there
is to check and passes, as NOTES.txt says.

The Lease is written by the operator's own leader election (runtime/lease.py) with a token of
the chart's ServiceAccount, as a replica would; the `helm test` pod is played as a kubelet
would run it (it exits 0), since nothing executes on kwok nodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import POOL_LABEL, rtx_pool
from dsv4_devcluster.kubelet import MANUAL_STATUS_ANNOTATION, report_pod_exited
from dsv4_devcluster.prober import report_pod_started
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.runtime.lease import LeaderElector, Timing

from ..chart.support import CHART, helm_args, tool
from .cluster_support import service_account_kubeconfig
from .helm_support import Helm

pytestmark = pytest.mark.integration
POOL = "chart-uninstall"
RELEASE = "gone"
FULLNAME = f"{RELEASE}-dsv4-operator"
# Another release for the other test: the releases' cluster-scoped objects are named after them.
WEBHOOKLESS = "webhookless"
# Namespaced kinds a release could leave behind (Events are the API server's, not the chart's).
KINDS = [
    ("v1", "Pod"),
    ("v1", "ServiceAccount"),
    ("v1", "Service"),
    ("v1", "Secret"),
    ("v1", "ConfigMap"),
    ("apps/v1", "Deployment"),
    ("policy/v1", "PodDisruptionBudget"),
    ("coordination.k8s.io/v1", "Lease"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
]
# What a namespace holds before any release: the API server's and the controllers' own.
BUILT_IN = {("ServiceAccount", "default"), ("ConfigMap", "kube-root-ca.crt")}


@pytest.fixture(scope="module")
def uninstall_nodes(control_plane: ControlPlane) -> list[str]:
    return rtx_pool(control_plane, "chart-uninstall", 1, pool=POOL)


def _left(dyn: Any, namespaces: list[str]) -> set[tuple[str, str, str]]:
    found = set()
    for api_version, kind in KINDS:
        resource = dyn.resources.get(api_version=api_version, kind=kind)
        for namespace in namespaces:
            for item in resource.get(namespace=namespace).items:
                if (kind, item.metadata.name) not in BUILT_IN:
                    found.add((namespace, kind, item.metadata.name))
    return found


def _lead_once(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, fullname: str = FULLNAME
) -> None:
    """Take the Lease as a replica of the chart does: its env's name and owner, its token."""
    kubeconfig = service_account_kubeconfig(
        control_plane, namespace, fullname, tmp_path / "operator.kubeconfig"
    )

    async def lead() -> None:
        client = KubeClient.from_environment(str(kubeconfig), field_manager="dsv4-operator")
        try:
            elector = LeaderElector(
                client, namespace, fullname, "replica-0", Timing(), owner=fullname
            )
            await asyncio.wait_for(elector.acquire(), timeout=60)
        finally:
            await client.close()

    asyncio.run(lead())


def _helm_test_passes(dyn: Any, helm: Helm, namespace: str) -> str:
    """`helm test`, with this test as the test pod's kubelet: the pod runs and exits 0."""
    argv = [str(tool("helm")), "--kubeconfig", str(helm.kubeconfig)]
    argv += ["test", RELEASE, "-n", namespace, "--timeout", "2m"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
        pods = dyn.resources.get(api_version="v1", kind="Pod")
        name = f"{FULLNAME}-selftest"

        def scheduled() -> bool:
            try:
                return bool(pods.get(name=name, namespace=namespace).spec.nodeName)
            except Exception:
                return False

        wait_for("the helm test pod scheduled", scheduled, timeout=60)
        report_pod_started(dyn, namespace, name, "10.244.200.7")
        report_pod_exited(dyn, namespace, name, "selftest", 0, "PASS")
        output, _ = run.communicate(timeout=150)
        assert run.returncode == 0, output
    return output


@pytest.mark.long(seconds=30)
def test_helm_uninstall_leaves_only_the_crd(
    control_plane: ControlPlane,
    dyn: Any,
    namespace: str,
    work_namespace: str,
    uninstall_nodes: list[str],
    tmp_path: Path,
) -> None:
    helm = Helm(control_plane.kubeconfig_path)
    key, value = MANUAL_STATUS_ANNOTATION
    values = {
        "nodeSelector": {POOL_LABEL: POOL},
        "crds": {"enabled": False},  # the control plane's own CRD: kept, as crds.keep does
        "watchNamespaces": [work_namespace],
        "podAnnotations": {key: value},  # kwok leaves the pods (the test pod's too) to this test
    }
    before = _left(dyn, [namespace, work_namespace])
    helm("install", RELEASE, CHART, "--namespace", namespace, *helm_args(values))
    try:
        _lead_once(control_plane, namespace, tmp_path)
        leases = dyn.resources.get(api_version="coordination.k8s.io/v1", kind="Lease")
        lease = leases.get(name=FULLNAME, namespace=namespace).to_dict()
        (owner,) = lease["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("Deployment", FULLNAME)

        output = _helm_test_passes(dyn, helm, namespace)
        # One entry per check: the selftest pod, not its ServiceAccount and Roles.
        assert output.count("TEST SUITE:") == 1 and f"{FULLNAME}-selftest" in output, output
        pods = dyn.resources.get(api_version="v1", kind="Pod")
        wait_for(
            "the passed test pod deleted (hook-succeeded)",
            lambda: (
                not [
                    p
                    for p in pods.get(namespace=namespace).items
                    if p.metadata.name == f"{FULLNAME}-selftest"
                ]
            ),
            timeout=60,
        )
    finally:
        helm.uninstall(RELEASE, namespace)
    left: set[tuple[str, str, str]] = set()

    def nothing_left() -> bool:
        nonlocal left
        left = _left(dyn, [namespace, work_namespace]) - before
        return not left

    # The Lease goes with its owner: the garbage collector deletes it after the Deployment.
    try:
        wait_for("nothing of the release left", nothing_left, timeout=90)
    except Exception as error:
        raise AssertionError(f"helm uninstall left {sorted(left)}") from error
    crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    assert crds.get(name="dsv4deployments.dsv4.io").metadata.name  # kept, as docs say
    cluster_scoped = [
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"),
    ]
    for api_version, kind in cluster_scoped:
        names = [
            i.metadata.name
            for i in dyn.resources.get(api_version=api_version, kind=kind).get().items
        ]
        assert not [n for n in names if n.startswith(FULLNAME)], (kind, names)


def _selftest(control_plane: ControlPlane, namespace: str, args: list[str], tmp_path: Path) -> Any:
    """The chart's test pod's args, run as `dsv4` with its ServiceAccount's token."""
    kubeconfig = service_account_kubeconfig(
        control_plane, namespace, f"{WEBHOOKLESS}-dsv4-operator-test", tmp_path / "test.kubecfg"
    )
    return subprocess.run(
        [sys.executable, "-m", "dsv4_operator.cli", *args, "-o", "json"],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.long(seconds=20)
def test_with_the_webhook_off_helm_test_checks_what_there_is_and_passes(
    control_plane: ControlPlane,
    dyn: Any,
    namespace: str,
    work_namespace: str,
    uninstall_nodes: list[str],
    tmp_path: Path,
) -> None:
    helm, fullname = Helm(control_plane.kubeconfig_path), f"{WEBHOOKLESS}-dsv4-operator"
    values = {
        "nodeSelector": {POOL_LABEL: POOL},  # kwok runs the operator pods: the Deployment is up
        "crds": {"enabled": False},
        "watchNamespaces": [work_namespace],
        "webhook": {"enabled": False},
    }
    helm("install", WEBHOOKLESS, CHART, "--namespace", namespace, *helm_args(values))
    try:
        deployments = dyn.resources.get(api_version="apps/v1", kind="Deployment")
        wait_for(
            "the operator Deployment available",
            lambda: deployments.get(name=fullname, namespace=namespace).status.availableReplicas,
            timeout=90,
        )
        _lead_once(control_plane, namespace, tmp_path, fullname)
        template = helm("get", "hooks", WEBHOOKLESS, "-n", namespace).stdout
        (pod,) = [d for d in yaml.safe_load_all(template) if d and d["kind"] == "Pod"]
        args = pod["spec"]["containers"][0]["args"]
        assert "--no-webhook" in args
        passed = _selftest(control_plane, namespace, args, tmp_path)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        checks = {c["name"]: c["ok"] for c in json.loads(passed.stdout)["checks"]}
        assert checks == {"operator": True, "leader": True, "admitsSound": True}
        # Without --no-webhook nothing refuses the unsafe spec: the test would fail for good.
        checked = _selftest(
            control_plane, namespace, [a for a in args if a != "--no-webhook"], tmp_path
        )
        assert checked.returncode == 1
        (unsafe,) = [
            c for c in json.loads(checked.stdout)["checks"] if c["name"] == "refusesUnsafe"
        ]
        assert unsafe["reason"] == "UnsafeAdmitted"
    finally:
        helm.uninstall(WEBHOOKLESS, namespace)

"""Integration-test helpers on the API server: whether an object exists, what refusal a create
gets, a server-side dry run of a rendered child, a router never targeting two transfer
formats, an admission policy on StatefulSets, and a ServiceAccount's kubeconfig. The operator
process and the example deployment are test support shared with the demo and the benchmarks:
dsv4_devcluster.operator and .deployments."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import Cluster
from dsv4_operator.engine.effective import parse_args
from dsv4_operator.kube.client import yaml_safe_json
from dsv4_operator.names import API_VERSION, KIND
from tests.chart.support import tool


def exists(resource: Any, name: str, namespace: str | None = None) -> bool:
    try:
        resource.get(name=name, namespace=namespace)
    except NotFoundError:
        return False
    return True


@contextlib.contextmanager
def new_namespace(dyn: Any, name: str) -> Iterator[str]:
    """Namespace `name` with its default ServiceAccount in place; deleted afterwards."""
    namespaces = dyn.resources.get(api_version="v1", kind="Namespace")
    namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    service_accounts = dyn.resources.get(api_version="v1", kind="ServiceAccount")
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: exists(service_accounts, "default", name),
        timeout=60,
    )
    yield name
    namespaces.delete(name=name)


def rejection(dyn: Any, body: dict[str, Any], **params: Any) -> tuple[int, str]:
    """Create ``body`` expecting the API server to refuse it; return (status, message)."""
    resource = dyn.resources.get(api_version=API_VERSION, kind=KIND)
    with pytest.raises(DynamicApiError) as info:
        resource.create(body=body, namespace=body["metadata"]["namespace"], **params)
    err = info.value
    message = yaml.safe_load(err.body).get("message", "") if err.body else str(err)
    return err.status, message


BUSY = (429, 504)  # the API server did not answer in time: no verdict, ask again


def dry_run_apply(dyn: Any, namespace: str, child: dict[str, Any]) -> dict[str, Any]:
    """A server-side dry-run apply of a rendered `child` (schema, defaulting, admission
    webhooks such as LWS's; nothing stored); returns the object the API server would store.
    Its body is encoded as the operator encodes it (`yaml_safe_json`: the apply-patch+yaml
    parser refuses what plain json.dumps writes for some characters). A refusal raises
    AssertionError carrying the API server's reasons."""
    resource = dyn.resources.get(api_version=child["apiVersion"], kind=child["kind"])
    for attempt in range(3):
        try:
            applied = resource.server_side_apply(
                body=yaml_safe_json(child).decode(),
                name=child["metadata"]["name"],
                namespace=namespace,
                field_manager="dry-run-check",
                query_params=[("dryRun", "All")],
            )
            result: dict[str, Any] = applied.to_dict()
            return result
        except Exception as error:
            if getattr(error, "status", None) in BUSY and attempt < 2:
                time.sleep(1)
                continue
            raise AssertionError(
                f"the API server refused {child['kind']} {child['metadata']['name']}: "
                f"{getattr(error, 'body', error)}"
            ) from error
    raise AssertionError("unreachable")


def watch_router(cluster: Cluster, until: Callable[[], bool], timeout: float = 240) -> int:
    """Poll the router's targets until `until()`; fail on a mixed-format observation."""
    deadline = time.monotonic() + timeout
    observations = 0
    while time.monotonic() < deadline:
        for formats in cluster.router_formats():
            observations += 1
            assert len(formats) <= 1, f"a router targets pods of several formats: {formats}"
        if until():
            return observations
        time.sleep(0.2)
    raise TimeoutError("condition not reached while watching the router")


def engine_flags(sts: dict[str, Any]) -> dict[str, tuple[int, str | None]]:
    return parse_args(sts["spec"]["template"]["spec"]["containers"][0]["command"])


def statefulset_policy(
    dyn: Any, namespace: str, expression: str, message: str, name: str = "policy"
) -> Callable[[], None]:
    """A ValidatingAdmissionPolicy (the API server's own CEL admission, what a cluster's
    policy engine does) on creates, updates and deletes of StatefulSets in `namespace`,
    refusing those where `expression` is false with `message`; returns the undo once the
    policy is in force. Not on `statefulsets/status`: the StatefulSet controller keeps
    working."""
    policies = dyn.resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicy"
    )
    bindings = dyn.resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicyBinding"
    )
    full = f"{name}-{namespace}"
    policies.create(
        body={
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": full},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE", "DELETE"],
                            "resources": ["statefulsets"],
                        }
                    ]
                },
                "validations": [{"expression": expression, "message": message}],
            },
        }
    )
    bindings.create(
        body={
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": full},
            "spec": {
                "policyName": full,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )

    def undo() -> None:
        bindings.delete(name=full)
        policies.delete(name=full)

    # A binding takes effect a moment later: wait until a StatefulSet of 3 replicas (which
    # every policy the tests use refuses) is refused with `message`.
    statefulsets = dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    probe = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "policy-probe", "namespace": namespace},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }

    def in_force() -> bool:
        try:
            statefulsets.create(body=probe, namespace=namespace, dry_run="All")
        except Exception as error:
            return message in str(getattr(error, "body", error))
        return False

    wait_for(f"the policy {full} in force", in_force, timeout=60)
    return undo


def service_account_kubeconfig(cp: ControlPlane, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a TokenRequest token)."""
    api = cp.api_client()
    try:
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(expiration_seconds=3600)
        )
        status = (
            k8s.CoreV1Api(api).create_namespaced_service_account_token(name, namespace, request)
        ).status
        assert status is not None, "the TokenRequest came back without a status"
        token = status.token
    finally:
        api.close()
    config = yaml.safe_load(cp.kubeconfig_path.read_text())
    config["users"] = [{"name": name, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = name
    path.write_text(yaml.safe_dump(config))
    return path


def kubectl_get_dsv4(control_plane: ControlPlane, namespace: str) -> str:
    """`kubectl get dsv4 -n <namespace>`, as a user sees it (the CRD's printer columns)."""
    return subprocess.run(
        [
            str(tool("kubectl")),
            "--kubeconfig",
            str(control_plane.kubeconfig_path),
            "get",
            "dsv4",
            "-n",
            namespace,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def post_pod_warning(cluster: Cluster, pod: str, reason: str, message: str) -> None:
    """A Warning Event on `pod`, as the kubelet posts one."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cluster.dyn.resources.get(api_version="v1", kind="Event").create(
        namespace=cluster.namespace,
        body={
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod}.{time.monotonic_ns()}"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod,
                "namespace": cluster.namespace,
            },
            "type": "Warning",
            "reason": reason,
            "message": message,
            "source": {"component": "kubelet"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        },
    )

"""The trust boundary on a real API server: names and bounds refused by the CRD, UTF-8 through
server-side apply, rendered pods under Pod Security `baseline`, and the operator's webhook
refusing URLs and node paths its configuration does not allow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.dynamic.exceptions import DynamicApiError

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import Cluster, example
from dsv4_devcluster.operator import OperatorProcess, webhook_operator
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.resources import resource_of
from dsv4_operator.render.children import render_spec

from .cluster_support import rejection

pytestmark = pytest.mark.integration


def _changed(namespace: str, field: str, value: Any) -> dict[str, Any]:
    """The example with one `spec.`-prefixed field set (the changes of
    dsv4_devcluster.deployments.example)."""
    return example(namespace, **{field.removeprefix("spec."): value})


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a" * 34, "must be at most 33 characters"),
        ("a" * 63, "must be at most 33 characters"),
        ("dsv4.flash", "must be a DNS-1035 label"),
        ("4flash", "must be a DNS-1035 label"),
    ],
)
def test_the_crd_refuses_names_whose_children_would_break(
    dyn: Any, dsv4_crd: dict[str, Any], namespace: str, name: str, message: str
) -> None:
    status, text = rejection(dyn, example(namespace, name=name))
    assert status == 422 and message in text, text


def test_the_longest_allowed_name_is_accepted(
    dyn: Any, dsv4_crd: dict[str, Any], namespace: str
) -> None:
    resource = dyn.resources.get(api_version="dsv4.io/v1alpha1", kind="DSV4Deployment")
    resource.create(body=example(namespace, name="a" * 33), namespace=namespace)


HOSTILE_VALUES = [
    ("spec.guard.canary.sessions", 2_000_000, "less than or equal to 64"),
    ("spec.decode.replicas", 2_147_483_647, "less than or equal to 128"),
    ("spec.guard.canary.interval", "0s", "must be at least 1s"),
    ("spec.guard.oom.window", "9999999999h", "should match"),
    ("spec.guard.bakeTime", "999999999h", "must be at most 168h"),
    ("spec.gpu.memoryGiB", 1e300, "less than or equal to 4096"),
    ("spec.engine.env", [{"name": "CAFÉ", "value": "x"}], "should match"),
    ("spec.decode.resources", {"requests": {"memory": "lots"}}, "should match"),
    ("spec.decode.nodeSelector", {"pool": "x" * 64}, "may not be more than 63"),
]


@pytest.mark.parametrize(("field", "value", "message"), HOSTILE_VALUES)
def test_the_crd_refuses_values_outside_the_bounds(
    dyn: Any, dsv4_crd: dict[str, Any], namespace: str, field: str, value: Any, message: str
) -> None:
    doc = _changed(namespace, field, value)
    status, text = rejection(dyn, doc)
    assert status == 422 and field.removeprefix("spec.") in text and message in text, text


async def test_non_bmp_text_round_trips_through_server_side_apply(
    control_plane: ControlPlane, namespace: str
) -> None:
    client = KubeClient.from_environment(str(control_plane.kubeconfig_path), "dsv4-tests")
    text = "launch 🚀 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ünïcödé"
    service: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "utf8", "namespace": namespace, "annotations": {"note": text}},
        "spec": {"ports": [{"name": text.encode().hex()[:15], "port": 80}]},
    }
    try:
        await client.apply(service)
        stored = await client.get(resource_of(service), namespace, "utf8")
    finally:
        await client.close()
    assert stored is not None
    assert stored["metadata"]["annotations"]["note"] == text


def _pods_of(children: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    pods = []
    for child in children:
        if child["kind"] not in ("StatefulSet", "Deployment"):
            continue
        template = child["spec"]["template"]
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": child["metadata"]["name"], "namespace": namespace},
                "spec": template["spec"],
            }
        )
    return pods


def _baseline_namespace(dyn: Any, namespace: str) -> None:
    namespaces = dyn.resources.get(api_version="v1", kind="Namespace")
    namespaces.patch(
        name=namespace,
        body={"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}},
        content_type="application/merge-patch+json",
    )


def test_rendered_pods_pass_pod_security_baseline(dyn: Any, namespace: str) -> None:
    _baseline_namespace(dyn, namespace)
    doc = example(namespace)
    children = render_spec("dsv4-flash", namespace, DSV4DeploymentSpec.model_validate(doc["spec"]))
    pods = _pods_of(children, namespace)
    assert len(pods) == 3  # prefill, decode, router
    resource = dyn.resources.get(api_version="v1", kind="Pod")
    for pod in pods:
        assert pod["spec"]["automountServiceAccountToken"] is False
        resource.create(body=pod, namespace=namespace, dry_run="All")
    # What the operator allows only through its hostPath allow-list does not pass baseline:
    # docs/security.md says so, and this is why no prefix is allowed by default.
    host = _changed(namespace, "spec.model.cache", {"hostPath": {"path": "/mnt/models"}})
    [engine, *_] = _pods_of(
        render_spec("dsv4-flash", namespace, DSV4DeploymentSpec.model_validate(host["spec"])),
        namespace,
    )
    with pytest.raises(DynamicApiError) as refused:
        resource.create(body=engine, namespace=namespace, dry_run="All")
    assert "hostPath volumes" in yaml.safe_load(str(refused.value.body))["message"]


REFUSED_BY_POLICY = [
    ("spec.guard.canary.endpoint", "http://169.254.169.254/latest", "router Service"),
    ("spec.guard.prometheus", {"url": "http://evil.example:9090"}, "operator's Prometheus"),
    ("spec.model.cache", {"hostPath": {"path": "/"}}, "allows no hostPath"),
    ("spec.guard.canary.interval", "1s", "floor of 10s"),
]


def test_the_webhook_refuses_what_the_operator_does_not_allow(
    control_plane: ControlPlane, dyn: Any, dsv4_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> None:
    configs = dyn.resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingWebhookConfiguration"
    )
    cluster = Cluster(dyn, namespace)
    webhook = webhook_operator(control_plane.kubeconfig_path, namespace, tmp_path)
    try:
        probe = _changed(namespace, *REFUSED_BY_POLICY[0][:2])

        def refused() -> str | None:
            try:
                cluster.apply(probe)
            except DynamicApiError as error:
                return str(yaml.safe_load(str(error.body)).get("message", ""))
            cluster.dsv4.delete(name="dsv4-flash", namespace=namespace)
            return None  # the webhook was not wired yet; try again

        wait_for("the API server to call the webhook", refused, timeout=60)
        for field, value, message in REFUSED_BY_POLICY:
            status, text = rejection(dyn, _changed(namespace, field, value))
            assert status == 422 and "[trust]" in text and message in text, text
            assert field in text, text
        cluster.apply(example(namespace))  # the example itself is admitted
    finally:
        webhook.stop()
        for config in configs.get().to_dict()["items"]:
            if config["metadata"]["name"] == "dsv4.io.validation":
                configs.delete(name="dsv4.io.validation")


def test_a_refused_url_past_admission_is_reported_and_never_fetched(
    dyn: Any, dsv4_crd: dict[str, Any], namespace: str, operator: OperatorProcess
) -> None:
    """Without the webhook (or from before a policy change) the reconcile refuses the spec,
    and the guard has nothing to report: it never fetched the URL."""
    cluster = Cluster(dyn, namespace)
    cluster.apply(_changed(namespace, "spec.guard.canary.endpoint", "http://10.0.0.1:80"))
    obj = cluster.wait_phase("Invalid", timeout=60)
    [finding] = [f for f in obj["status"]["findings"] if f["rule"] == "trust"]
    assert finding["field"] == "spec.guard.canary.endpoint"
    assert not obj["status"].get("guard", {}).get("lastMessage")
    assert cluster.children() == {}

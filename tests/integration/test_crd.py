"""The DSV4Deployment CRD on a real kube-apiserver: the example is accepted, the structural
schema and CEL rules reject bad objects with their messages, status only moves through the
/status subresource, and owned children are garbage-collected with their DSV4Deployment."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsv4_devcluster import wait_for

from .cluster_support import exists, rejection

pytestmark = pytest.mark.integration

API_VERSION = "dsv4.io/v1alpha1"
KIND = "DSV4Deployment"
MERGE_PATCH = "application/merge-patch+json"
EXAMPLE_PATH = Path(__file__).resolve().parents[2] / "examples" / "dsv4.yaml"
CEL_CONTEXT_MESSAGE = "spec.workload.contextTokens must not exceed spec.engine.contextLength"


def example(namespace: str, name: str = "dsv4-flash") -> dict[str, Any]:
    """``examples/dsv4.yaml`` moved into the test's namespace."""
    assert EXAMPLE_PATH.is_file(), f"{EXAMPLE_PATH} is missing"
    obj: dict[str, Any] = yaml.safe_load(EXAMPLE_PATH.read_text())
    obj["metadata"] = {"name": name, "namespace": namespace}
    return obj


def is_subset(sent: Any, stored: Any) -> bool:
    """Every field we sent is stored unchanged (the server may add defaults)."""
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(
            k in stored and is_subset(v, stored[k]) for k, v in sent.items()
        )
    return bool(sent == stored)


@pytest.fixture
def dsv4(dyn: Any, dsv4_crd: dict[str, Any]) -> Any:
    """The DSV4Deployment resource client (CRD installed)."""
    return dyn.resources.get(api_version=API_VERSION, kind=KIND)


def test_crd_is_what_the_tests_expect(dsv4_crd: dict[str, Any]) -> None:
    spec = dsv4_crd["spec"]
    assert spec["group"] == "dsv4.io"
    assert spec["names"]["kind"] == KIND
    assert spec["names"]["plural"] == "dsv4deployments"
    [version] = [v for v in spec["versions"] if v["name"] == "v1alpha1"]
    assert "status" in version.get("subresources", {})
    rules = version["schema"]["openAPIV3Schema"]["properties"]["spec"].get(
        "x-kubernetes-validations", []
    )
    assert CEL_CONTEXT_MESSAGE in [r.get("message") for r in rules], rules


def test_example_is_accepted_and_stored(dsv4: Any, namespace: str) -> None:
    body = example(namespace)
    created = dsv4.create(body=body, namespace=namespace).to_dict()
    stored = dsv4.get(name=body["metadata"]["name"], namespace=namespace).to_dict()
    assert stored["metadata"]["uid"] == created["metadata"]["uid"]
    assert is_subset(body["spec"], stored["spec"]), stored["spec"]


def test_enum_violation_is_rejected(dyn: Any, dsv4: Any, namespace: str) -> None:
    body = example(namespace, "bad-enum")
    body["spec"]["engine"]["indexKDtype"] = "int8"
    status, message = rejection(dyn, body)
    assert status == 422
    assert 'spec.engine.indexKDtype: Unsupported value: "int8"' in message
    assert '"fp8"' in message


def test_wrong_type_is_rejected(dyn: Any, dsv4: Any, namespace: str) -> None:
    body = example(namespace, "bad-type")
    body["spec"]["prefill"]["tensorParallel"] = "four"
    status, message = rejection(dyn, body)
    assert status == 422
    assert "spec.prefill.tensorParallel: Invalid value" in message
    assert "must be of type integer" in message


def test_unknown_field_rejected_under_strict_validation(
    dyn: Any, dsv4: Any, namespace: str
) -> None:
    body = example(namespace, "unknown-field")
    body["spec"]["engine"]["turboMode"] = True
    status, message = rejection(dyn, body, query_params=[("fieldValidation", "Strict")])
    assert status == 400  # BadRequest, as documented for fieldValidation=Strict
    assert 'unknown field "spec.engine.turboMode"' in message

    # Without Strict the server prunes it instead (structural schema), never stores it.
    created = dsv4.create(body=body, namespace=namespace).to_dict()
    assert "turboMode" not in created["spec"]["engine"]


def test_cel_rule_violation_is_rejected(dyn: Any, dsv4: Any, namespace: str) -> None:
    body = example(namespace, "bad-cel")
    body["spec"]["workload"]["contextTokens"] = body["spec"]["engine"]["contextLength"] + 1
    status, message = rejection(dyn, body)
    assert status == 422
    assert CEL_CONTEXT_MESSAGE in message


def test_status_changes_only_through_status_subresource(dsv4: Any, namespace: str) -> None:
    body = example(namespace, "status")
    body["status"] = {"observedGeneration": 7, "currentRevision": "from-create"}
    created = dsv4.create(body=body, namespace=namespace).to_dict()
    assert (created.get("status") or {}).get("currentRevision") is None  # dropped on create

    # A status in a normal update is dropped; the spec change in it is kept.
    obj = copy.deepcopy(created)
    obj["status"] = {"observedGeneration": 7, "currentRevision": "from-update"}
    obj["spec"]["engine"]["cudaGraphMaxBs"] = 32
    updated = dsv4.replace(body=obj, namespace=namespace).to_dict()
    assert (updated.get("status") or {}).get("currentRevision") is None
    assert updated["spec"]["engine"]["cudaGraphMaxBs"] == 32
    assert updated["metadata"]["generation"] == 2

    # Through /status it sticks, and a spec change smuggled in is ignored.
    patched = dsv4.status.patch(
        name="status",
        namespace=namespace,
        body={
            "status": {"observedGeneration": 2, "currentRevision": "abc123"},
            "spec": {"engine": {"cudaGraphMaxBs": 8}},
        },
        content_type=MERGE_PATCH,
    ).to_dict()
    assert patched["status"]["currentRevision"] == "abc123"
    assert patched["status"]["observedGeneration"] == 2
    assert patched["spec"]["engine"]["cudaGraphMaxBs"] == 32
    assert patched["metadata"]["generation"] == 2  # status writes do not bump generation


def test_deleting_dsv4deployment_collects_children(dyn: Any, dsv4: Any, namespace: str) -> None:
    owner = dsv4.create(body=example(namespace, "owner"), namespace=namespace)
    ref = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": "owner",
        "uid": owner.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    services = dyn.resources.get(api_version="v1", kind="Service")
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    services.create(
        namespace=namespace,
        body={
            "metadata": {"name": "owner-router", "ownerReferences": [ref]},
            "spec": {"ports": [{"port": 8000}], "selector": {"app": "router"}},
        },
    )
    cms.create(
        namespace=namespace,
        body={"metadata": {"name": "owner-config", "ownerReferences": [ref]}},
    )

    dsv4.delete(name="owner", namespace=namespace)

    def gone(resource: Any, name: str) -> bool:
        return not exists(resource, name, namespace)

    wait_for("Service collected", lambda: gone(services, "owner-router"), timeout=120)
    wait_for("ConfigMap collected", lambda: gone(cms, "owner-config"), timeout=120)

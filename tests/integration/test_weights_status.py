"""WeightsReady against a real API server: a missing Hub token Secret is refused before any
download Job exists (and the Job follows once the Secret is created); a claim that does not
bind reads Pending and says so, never "downloading"."""

from __future__ import annotations

from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import Cluster, example, rtx_pool
from dsv4_devcluster.operator import OperatorProcess
from tests.integration.cluster_support import kubectl_get_dsv4
from tests.integration.weights_support import token_secret

pytestmark = pytest.mark.integration

REPO_ID = "example-org/tiny-dsv4"


@pytest.fixture(scope="module")
def weights_pool(control_plane: ControlPlane, dsv4_crd: dict[str, Any]) -> list[str]:
    return rtx_pool(control_plane, "wstatus-rtx", 1)


def _spec(namespace: str, **hub: Any) -> dict[str, Any]:
    source = {
        "revision": "main",
        "endpoint": "http://127.0.0.1:9",  # never reached: nothing downloads in these tests
        "storage": "10Gi",
        "storageClassName": "dsv4-test-no-provisioner",
        **hub,
    }
    model: dict[str, Any] = {"model.name": REPO_ID, "model.cache": {"huggingFace": source}}
    return example(namespace, **model)


def _condition(cluster: Cluster, type_: str) -> dict[str, Any]:
    conditions = cluster.get().get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), {})


def _jobs(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.items("batch/v1", "Job", "dsv4.io/model=dsv4-flash")


def test_a_missing_token_secret_is_refused_before_any_job(
    control_plane: ControlPlane,
    dyn: Any,
    namespace: str,
    weights_pool: list[str],
    operator: OperatorProcess,
) -> None:
    cluster = Cluster(dyn, namespace)
    cluster.apply(_spec(namespace, tokenSecret={"name": "hf-token"}))

    def refused() -> dict[str, Any] | None:
        weights = _condition(cluster, "WeightsReady")
        return weights if weights.get("reason") == "TokenSecretMissing" else None

    weights = wait_for("WeightsReady TokenSecretMissing", refused, timeout=60)
    assert "Secret hf-token" in weights["message"] and "'token'" in weights["message"]
    assert (
        _jobs(cluster) == []
    )  # refused before the Job: no pod stuck in CreateContainerConfigError
    status = cluster.get()["status"]
    assert status["phase"] == "Failed"
    assert _condition(cluster, "Degraded")["reason"] == "WeightsFailed"
    listed = kubectl_get_dsv4(control_plane, namespace)
    print(listed)
    assert "Failed" in listed and "WeightsFailed" in listed
    cluster.wait_events("WeightsTokenSecretMissing")
    token_secret(dyn, namespace, "hf_stand_in_token")
    wait_for("the download Job once the Secret exists", lambda: _jobs(cluster) or None, timeout=60)


def test_an_unbound_claim_reads_pending_and_says_so(
    dyn: Any, namespace: str, weights_pool: list[str], operator: OperatorProcess
) -> None:
    cluster = Cluster(dyn, namespace)
    cluster.apply(_spec(namespace))

    def pending() -> dict[str, Any] | None:
        weights = _condition(cluster, "WeightsReady")
        return weights if "not bound" in weights.get("message", "") else None

    weights = wait_for("WeightsReady Pending on the claim", pending, timeout=60)
    assert weights["reason"] == "Pending"
    assert "claim dsv4-flash-weights is Pending, not bound" in weights["message"]
    assert "downloading" not in weights["message"]
    assert cluster.get()["status"]["phase"] == "Progressing"

"""DSV4Model on the control plane, against the stand-in Hub: weights outlive a deployment.

Deleting and re-applying a deployment that names a Hub repo inline finds its DSV4Model
downloaded (no second Job, no request to the Hub); two deployments that reference one model
share its one download and claim; deleting a model in use waits (finalizer) and says for
whom, and it goes once they are gone. The Job's container runs here
(weights_support.JobContainer: kwok runs no process).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import Cluster, example, rtx_pool, volume_for
from dsv4_devcluster.hub import HubRepo, StandInHub
from dsv4_devcluster.operator import OperatorProcess
from tests.integration.weights_support import JobContainer

pytestmark = pytest.mark.integration

REPO_ID = "example-org/tiny-dsv4"
STORAGE_CLASS = "dsv4-test-models"
FILES = {
    "config.json": b'{"architectures": ["DeepseekV4ForCausalLM"]}',
    "model-00001-of-00001.safetensors": os.urandom(200_000),
}


@pytest.fixture
def hub() -> Iterator[StandInHub]:
    with StandInHub({REPO_ID: HubRepo(dict(FILES))}) as server:
        yield server


@pytest.fixture(scope="module")
def nodes(control_plane: ControlPlane, dsv4_crd: dict[str, Any]) -> list[str]:
    """Nodes for kwok to run the download Jobs' pods on."""
    return rtx_pool(control_plane, "models-rtx", 1)


@pytest.fixture
def cluster(dyn: Any, namespace: str, nodes: list[str], operator: OperatorProcess) -> Cluster:
    return Cluster(dyn, namespace)


def _models(cluster: Cluster) -> Any:
    return cluster.dyn.resources.get(api_version="dsv4.io/v1alpha1", kind="DSV4Model")


def _model(cluster: Cluster, name: str) -> dict[str, Any] | None:
    from kubernetes.dynamic.exceptions import NotFoundError

    try:
        found: dict[str, Any] = (
            _models(cluster).get(name=name, namespace=cluster.namespace).to_dict()
        )
    except NotFoundError:
        return None
    return found


def _condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


def _jobs(cluster: Cluster, model: str) -> list[dict[str, Any]]:
    return cluster.items("batch/v1", "Job", f"dsv4.io/model={model}")


def _download(cp: ControlPlane, cluster: Cluster, model: str, tmp_path: Path) -> None:
    """The model's one Job, run to completion here, into a directory standing for its claim."""
    job = wait_for(f"the download Job of {model}", lambda: _jobs(cluster, model) or None, 60)[0]
    claim_dir = tmp_path / f"{model}-claim"
    claim_dir.mkdir()
    work = tmp_path / f"{model}-job"
    work.mkdir()
    assert JobContainer(cp, cluster.namespace, job, claim_dir, work).start().finish() == 0


def _weights_ready(cluster: Cluster, name: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        c = _condition(cluster.get(name), "WeightsReady")
        return c if c.get("status") == "True" else None

    return wait_for(f"WeightsReady=True on {name}", ready, timeout=60)


def _claims_of(cluster: Cluster, name: str) -> set[str]:
    sts = cluster.items("apps/v1", "StatefulSet", f"dsv4.io/deployment={name}")
    volumes = [v for s in sts for v in s["spec"]["template"]["spec"]["volumes"]]
    return {v["persistentVolumeClaim"]["claimName"] for v in volumes if v["name"] == "models"}


def _inline(cluster: Cluster, hub: StandInHub, name: str) -> dict[str, Any]:
    source = {
        "endpoint": hub.endpoint,
        "storage": "1Gi",
        "storageClassName": STORAGE_CLASS,
    }
    return example(
        cluster.namespace, name, **{"model.name": REPO_ID, "model.cache": {"huggingFace": source}}
    )


def _hub_files(hub: StandInHub) -> int:
    return sum(1 for method, path, _ in hub.log.requests if method == "GET" and "/resolve/" in path)


def test_deleting_and_reapplying_a_deployment_does_not_download_again(
    control_plane: ControlPlane,
    cluster: Cluster,
    operator: OperatorProcess,
    hub: StandInHub,
    tmp_path: Path,
) -> None:
    name = "reapplied"
    volume_for(
        cluster.dyn,
        cluster.namespace,
        f"{name}-weights",
        access_modes=("ReadWriteMany",),
        storage_class=STORAGE_CLASS,
        capacity="1Gi",
    )
    cluster.apply(_inline(cluster, hub, name))
    _download(control_plane, cluster, name, tmp_path)
    _weights_ready(cluster, name)
    assert _claims_of(cluster, name) == {f"{name}-weights"}
    requests, jobs = len(hub.log.requests), [j["metadata"]["uid"] for j in _jobs(cluster, name)]
    assert _hub_files(hub) == len(FILES) and len(jobs) == 1

    cluster.dsv4.delete(name=name, namespace=cluster.namespace)
    wait_for(
        "the deployment gone",
        lambda: not cluster.items("dsv4.io/v1alpha1", "DSV4Deployment") or None,
        60,
    )
    model = _model(cluster, name)
    assert model is not None and model["status"]["phase"] == "Ready"
    wait_for(
        "the model without users",
        lambda: not (_model(cluster, name) or {}).get("status", {}).get("usedBy") or None,
        30,
    )
    assert cluster.items("v1", "PersistentVolumeClaim", f"dsv4.io/model={name}")  # kept

    cluster.apply(_inline(cluster, hub, name))
    again = _weights_ready(cluster, name)
    print(f"WeightsReady after re-applying: {again['message']}")
    wait_for("the engines again", lambda: _claims_of(cluster, name) or None, 60)
    assert _claims_of(cluster, name) == {f"{name}-weights"}
    assert [j["metadata"]["uid"] for j in _jobs(cluster, name)] == jobs  # no second Job
    assert len(hub.log.requests) == requests  # not one request to the Hub
    assert operator.metric("dsv4_reconciles_total", result="error") == 0


def test_two_deployments_share_one_model_which_waits_for_them_when_deleted(
    control_plane: ControlPlane,
    cluster: Cluster,
    operator: OperatorProcess,
    hub: StandInHub,
    tmp_path: Path,
) -> None:
    model = "shared"
    volume_for(
        cluster.dyn,
        cluster.namespace,
        f"{model}-weights",
        access_modes=("ReadWriteMany",),
        storage_class=STORAGE_CLASS,
        capacity="1Gi",
    )
    _models(cluster).create(
        namespace=cluster.namespace,
        body={
            "apiVersion": "dsv4.io/v1alpha1",
            "kind": "DSV4Model",
            "metadata": {"name": model},
            "spec": {
                "repo": REPO_ID,
                "endpoint": hub.endpoint,
                "storage": "1Gi",
                "storageClassName": STORAGE_CLASS,
            },
        },
    )
    users = ("chat", "batch")
    for name in users:
        cluster.apply(
            example(
                cluster.namespace,
                name,
                **{"model.name": REPO_ID, "model.cache": {"model": {"name": model}}},
            )
        )
    _download(control_plane, cluster, model, tmp_path)
    for name in users:
        _weights_ready(cluster, name)
        wait_for(f"the engines of {name}", functools.partial(_claims_of, cluster, name), 60)
        assert _claims_of(cluster, name) == {f"{model}-weights"}
    assert len(_jobs(cluster, model)) == 1
    assert _hub_files(hub) == len(FILES)  # each file once, for both
    wait_for(
        "usedBy names both",
        lambda: (
            sorted((_model(cluster, model) or {}).get("status", {}).get("usedBy") or [])
            == sorted(users)
            or None
        ),
        30,
    )

    # Deleting the model while they use it: held by its finalizer, its status says by whom.
    _models(cluster).delete(name=model, namespace=cluster.namespace)

    def waits() -> dict[str, Any] | None:
        c = _condition(_model(cluster, model), "InUse")
        return c if c.get("reason") == "DeletionWaits" else None

    in_use = wait_for("InUse DeletionWaits", waits, timeout=30)
    print(f"InUse while deleted: {in_use['message']}")
    assert "batch, chat" in in_use["message"]
    held = _model(cluster, model)
    assert held is not None and held["metadata"]["deletionTimestamp"]
    assert "dsv4.io/model-in-use" in held["metadata"]["finalizers"]
    assert held["status"]["phase"] == "Terminating"
    assert _condition(cluster.get("chat"), "WeightsReady").get("status") == "True"  # serving

    cluster.dsv4.delete(name="chat", namespace=cluster.namespace)
    wait_for(
        "only batch named",
        lambda: (
            "chat" not in _condition(_model(cluster, model), "InUse").get("message", "chat") or None
        ),
        30,
    )
    assert (_model(cluster, model) or {})["status"]["usedBy"] == ["batch"]
    cluster.dsv4.delete(name="batch", namespace=cluster.namespace)
    wait_for("the model gone once unused", lambda: _model(cluster, model) is None or None, 60)
    assert operator.metric("dsv4_reconciles_total", result="error") == 0

"""Weights from the Hugging Face Hub on the control plane, against the stand-in Hub.

The operator creates the claim, the download Job and its rights; the engines wait. The Job's
container runs here (weights_support.JobContainer: kwok runs no process) against
dsv4_devcluster.hub, a local test double of the Hub's download API. WeightsReady reports the
progress the fetcher writes, the failure reason (404 here), and a killed attempt that the Job
retries and that resumes; once the Job is complete the engines start and the deployment is
Ready.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import POOL, POOL_LABEL, RTX, Cluster, example, volume_for
from dsv4_devcluster.hub import HubRepo, StandInHub
from dsv4_devcluster.operator import OperatorProcess
from dsv4_operator.weights.fetch import PARTIAL_SUFFIX
from tests.integration.cluster_support import kubectl_get_dsv4
from tests.integration.weights_support import JobContainer, token_secret

pytestmark = pytest.mark.integration

REPO_ID = "example-org/tiny-dsv4"
TOKEN = "hf_stand_in_token"
SHARD = "model-00001-of-00002.safetensors"
BIG = 24 << 20  # above huggingface_hub's 10 MiB read chunk: a part reaches the disk


@pytest.fixture(scope="module")
def gpu_nodes(control_plane: ControlPlane, dsv4_crd: dict[str, Any]) -> list[str]:
    names = [f"weights-rtx-{i}" for i in range(2)]
    for name in names:
        control_plane.add_gpu_node(name, gpus=8, product=RTX, labels={POOL_LABEL: POOL})
    return names


@pytest.fixture
def hub() -> Iterator[StandInHub]:
    files = {
        "config.json": b'{"architectures": ["DeepseekV4ForCausalLM"]}',
        "tokenizer.json": b"t" * 5000,
        SHARD: os.urandom(BIG),
        "model-00002-of-00002.safetensors": os.urandom(300_000),
    }
    with StandInHub({REPO_ID: HubRepo(files, token=TOKEN)}) as server:
        yield server


def _hub_spec(
    namespace: str,
    hub: StandInHub,
    name: str,
    repo: str,
    secret: str = "hf-token",
    **changes: Any,
) -> dict[str, Any]:
    return example(
        namespace,
        name,
        **{
            "model.name": repo,
            "model.cache": {
                "huggingFace": {
                    "revision": "main",
                    "endpoint": hub.endpoint,
                    "tokenSecret": {"name": secret},
                    "storage": "10Gi",
                    "storageClassName": "dsv4-test-weights",
                }
            },
            **changes,
        },
    )


def _weights(cluster: Cluster, name: str) -> dict[str, Any] | None:
    conditions = cluster.get(name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "WeightsReady"), None)


def _job(cluster: Cluster, name: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        jobs = cluster.items("batch/v1", "Job", f"dsv4.io/model={name}")
        return jobs[0] if jobs else None

    return wait_for(f"the download Job of {name}", found, timeout=60)


def _deploy(
    cluster: Cluster, hub: StandInHub, name: str, repo: str, tmp_path: Path, **changes: Any
) -> tuple[dict[str, Any], Path]:
    """A PV for the claim the operator will create, the DSV4Deployment, and its Job; the
    directory standing for the claim."""
    storage_class = "dsv4-test-weights"
    volume_for(
        cluster.dyn,
        cluster.namespace,
        f"{name}-weights",
        access_modes=("ReadWriteMany",),
        storage_class=storage_class,
        capacity="10Gi",
    )
    claim_dir = tmp_path / "claim"
    claim_dir.mkdir(parents=True)
    cluster.apply(_hub_spec(cluster.namespace, hub, name, repo, **changes))
    return _job(cluster, name), claim_dir


@pytest.fixture
def setup(
    control_plane: ControlPlane,
    dyn: Any,
    namespace: str,
    gpu_nodes: list[str],
    tmp_path: Path,
) -> Iterator[tuple[Cluster, OperatorProcess]]:
    token_secret(dyn, namespace, TOKEN)
    operator = OperatorProcess(control_plane.kubeconfig_path, namespace, tmp_path).start()
    try:
        yield Cluster(dyn, namespace), operator
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.log_tail(60)}")


def test_weights_are_downloaded_resumed_after_a_killed_pod_then_the_engines_start(
    control_plane: ControlPlane,
    setup: tuple[Cluster, OperatorProcess],
    hub: StandInHub,
    tmp_path: Path,
) -> None:
    cluster, operator = setup
    namespace, name = cluster.namespace, "hub-weights"
    job, claim_dir = _deploy(cluster, hub, name, REPO_ID, tmp_path)
    pending = wait_for("WeightsReady=False", lambda: _weights(cluster, name), timeout=30)
    assert pending["status"] == "False"
    assert cluster.items("apps/v1", "StatefulSet", f"dsv4.io/deployment={name}") == []

    # Attempt 1 stalls half-way through the big shard, shows its progress, and is killed.
    hub.stall_after(SHARD, 12 << 20)
    first = JobContainer(control_plane, namespace, job, claim_dir, tmp_path).start()

    def partial() -> dict[str, Any] | None:
        c = _weights(cluster, name)
        return c if c and c["reason"] == "Downloading" and "3/4 files" in c["message"] else None

    downloading = wait_for("progress in WeightsReady", partial, timeout=60)
    print(f"WeightsReady while downloading: {downloading['message']}")
    assert f"downloading {REPO_ID}@main: 3/4 files" in downloading["message"]
    # Killed once part of the shard is on the volume (the progress may come first on a busy
    # machine), so the next attempt has something to resume from.
    wait_for(
        "part of the shard on the volume",
        lambda: any(p.stat().st_size > 0 for p in claim_dir.rglob(f"*{PARTIAL_SUFFIX}")),
        timeout=60,
    )
    first.kill()
    hub.release()

    # The Job retries in a new pod (the Job controller's back-off), which resumes the shard.
    second = JobContainer(control_plane, namespace, job, claim_dir, tmp_path)
    second.start(exclude={first.pod["metadata"]["name"]} if first.pod else None)
    assert second.finish() == 0
    ranges = [r[2] for r in hub.log.requests if r[0] == "GET" and r[1].endswith(SHARD)]
    assert ranges[-1].startswith("bytes=") and ranges[-1] != "bytes=0-"
    assert hub.log.bytes_sent[SHARD] < 2 * BIG

    def downloaded() -> dict[str, Any] | None:
        c = _weights(cluster, name)
        return c if c and c["status"] == "True" else None

    done = wait_for("WeightsReady=True", downloaded, timeout=60)
    print(f"WeightsReady when complete: {done['message']}")
    assert "4/4 files" in done["message"] and "verified (Checksum)" in done["message"]
    ready = cluster.wait_phase("Ready", name, timeout=180)
    sts = cluster.items("apps/v1", "StatefulSet", f"dsv4.io/deployment={name}")
    for item in sts:
        volume = next(
            v for v in item["spec"]["template"]["spec"]["volumes"] if v["name"] == "models"
        )
        assert volume["persistentVolumeClaim"]["claimName"] == f"{name}-weights"
    assert ready["status"]["phase"] == "Ready"
    assert operator.metric("dsv4_reconciles_total", result="error") == 0


def test_a_missing_repo_fails_the_job_at_once_and_says_why(
    control_plane: ControlPlane,
    setup: tuple[Cluster, OperatorProcess],
    hub: StandInHub,
    tmp_path: Path,
) -> None:
    cluster, _operator = setup
    namespace, name = cluster.namespace, "hub-missing"
    job, claim_dir = _deploy(cluster, hub, name, "example-org/no-such-model", tmp_path)
    attempt = JobContainer(control_plane, namespace, job, claim_dir, tmp_path).start()
    assert attempt.finish() == 4
    started = time.monotonic()

    def failed() -> dict[str, Any] | None:
        c = _weights(cluster, name)
        return c if c and c["reason"] == "NotFound" else None

    condition = wait_for("WeightsReady NotFound", failed, timeout=30)
    print(f"WeightsReady after a 404: {condition['message']} ({time.monotonic() - started:.1f}s)")
    assert "404: repository example-org/no-such-model not found" in condition["message"]
    assert "check spec.model.name" in condition["message"]
    ready = next(c for c in cluster.get(name)["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "WeightsNotReady"
    # The Job gave up: a fault that stays until someone acts, as `kubectl get dsv4` shows.
    status = cluster.get(name)["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (status["phase"], degraded["reason"]) == ("Failed", "WeightsFailed")
    assert "NotFound" in degraded["message"]
    listed = kubectl_get_dsv4(control_plane, namespace)
    print(listed)
    assert "WeightsFailed" in listed
    # podFailurePolicy: no retry of a 404.
    live = cluster.items("batch/v1", "Job", f"dsv4.io/model={name}")[0]
    assert live["status"].get("failed") == 1 and not live["status"].get("active")
    events = cluster.wait_events("WeightsNotFound", name=name)
    assert [e["type"] for e in events if e["reason"] == "WeightsNotFound"] == ["Warning"]
    assert cluster.items("apps/v1", "StatefulSet", f"dsv4.io/deployment={name}") == []


def test_broken_deployments_each_read_failed_or_degraded_with_their_reason(
    control_plane: ControlPlane,
    setup: tuple[Cluster, OperatorProcess],
    hub: StandInHub,
    tmp_path: Path,
) -> None:
    """Six ways a deployment cannot come up, side by side in one namespace: `kubectl get dsv4`
    tells each failure from progress (PHASE Failed or Degraded) and names it (REASON), where
    every one of them used to read Progressing. (A full weights volume, DiskFull, is refused
    by the fetcher before it downloads: tests/unit cover it; no volume here can be filled.)"""
    cluster, _operator = setup
    namespace = cluster.namespace
    deadline = {"progressDeadlineSeconds": 20}
    token_secret(cluster.dyn, namespace, "hf_revoked_token", name="hf-revoked")
    # The Hub refuses: an unknown repo (404) and a token it does not accept (401).
    jobs = {
        name: _deploy(cluster, hub, name, repo, tmp_path / name, secret=secret, **deadline)
        for name, repo, secret in (
            ("hub-404", "example-org/no-such-model", "hf-token"),
            ("hub-401", REPO_ID, "hf-revoked"),
        )
    }
    for name, (job, claim_dir) in jobs.items():
        attempt = JobContainer(control_plane, namespace, job, claim_dir, tmp_path / name)
        assert attempt.start().finish() != 0
    # No token Secret at all: refused before any Job.
    cluster.apply(_hub_spec(namespace, hub, "no-token", REPO_ID, "hf-absent", **deadline))
    # A claim nobody created, and a GPU product no node has: the scheduler keeps them Pending.
    missing_claim = {"model.cache": {"pvc": {"claimName": "no-such-claim"}}}
    cluster.apply(example(namespace, "no-claim", **missing_claim, **deadline))
    volume_for(cluster.dyn, namespace, "no-gpu-weights", access_modes=("ReadOnlyMany",))
    claims = cluster.dyn.resources.get(api_version="v1", kind="PersistentVolumeClaim")
    claims.create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "no-gpu-weights"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": f"{namespace}-no-gpu-weights",
                "resources": {"requests": {"storage": "200Gi"}},
            },
        },
    )
    no_gpu = {"gpu.product": "NVIDIA-H200", "model.cache": {"pvc": {"claimName": "no-gpu-weights"}}}
    cluster.apply(example(namespace, "no-gpu", **no_gpu, **deadline))
    expected = {
        "hub-404": ("Failed", "WeightsFailed"),
        "hub-401": ("Failed", "WeightsFailed"),
        "no-token": ("Failed", "WeightsFailed"),
        "no-claim": ("Failed", "ProgressDeadlineExceeded"),
        "no-gpu": ("Failed", "ProgressDeadlineExceeded"),
    }

    def phases() -> dict[str, tuple[str, str]]:
        seen = {}
        for name in expected:
            status = cluster.get(name).get("status", {})
            degraded: dict[str, Any] = next(
                (c for c in status.get("conditions", []) if c["type"] == "Degraded"), {}
            )
            seen[name] = (status.get("phase", ""), degraded.get("reason", ""))
        return seen

    wait_for("every broken deployment Failed", lambda: phases() == expected, timeout=120)
    listed = kubectl_get_dsv4(control_plane, namespace)
    print(listed)
    messages = {
        name: next(
            c["message"]
            for c in cluster.get(name)["status"]["conditions"]
            if c["type"] == "Degraded"
        )
        for name in expected
    }
    for name, message in messages.items():
        print(f"{name}: {message}")
    assert "NotFound" in messages["hub-404"]
    assert "401" in messages["hub-401"] or "Unauthorized" in messages["hub-401"]
    assert "hf-absent" in messages["no-token"]
    assert "spec.progressDeadlineSeconds" in messages["no-claim"]
    assert '"no-such-claim" not found' in messages["no-claim"]
    assert "nvidia.com/gpu.product=NVIDIA-H200 (spec.gpu.product)" in messages["no-gpu"]
    for name, (phase, reason) in expected.items():
        row = next(line for line in listed.splitlines() if line.startswith(f"{name} "))
        assert phase in row and reason in row, row

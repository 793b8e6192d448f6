"""WeightsReady tells the truth (reconcile/weights.py through decide_model(), and the
deployment's copy through decide()): Pending while nothing downloads (and why), Downloading
only with figures, Verifying and never back, and a missing token Secret refused before any
Job exists."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dsv4_operator.api.models import DSV4ModelStatus
from dsv4_operator.api.status import Condition, DSV4DeploymentStatus
from dsv4_operator.reconcile.actions import Decision
from dsv4_operator.reconcile.decide import decide
from dsv4_operator.reconcile.model_decide import ModelDecision, decide_model
from dsv4_operator.weights.progress import PROGRESS_ANNOTATION, WeightsProgress
from tests.support.builders import make_world, model_world, stored_model

REPO_ID = "deepseek-ai/DeepSeek-V4-Flash"
GIB = 1 << 30
IMAGE = "registry.example.com/dsv4-operator:test"


def _hub(variant: Callable[..., dict[str, Any]], **hub: Any) -> dict[str, Any]:
    return variant({"model.name": REPO_ID, "model.cache": {"huggingFace": hub}})


def _model(deployment: Decision, status: DSV4ModelStatus | None = None) -> dict[str, Any]:
    """The DSV4Model the deployment's pass applied, as stored (with the model's `status`)."""
    model = next(o for o in deployment.apply if o["kind"] == "DSV4Model")
    return stored_model(model, status=status.to_wire() if status is not None else None)


def _passes(spec: dict[str, Any], **state: Any) -> tuple[Decision, ModelDecision, ModelDecision]:
    """The deployment's first pass, the model's first pass, then the model's next pass with
    its weights in `state`."""
    deployment = decide(make_world(spec))
    first = decide_model(model_world(_model(deployment)), IMAGE)
    weights = _weights(first, **state)
    second = decide_model(model_world(_model(deployment, first.status), weights=weights), IMAGE)
    return deployment, first, second


def _weights(
    first: ModelDecision, claim: str = "Bound", pod: dict[str, Any] | None = None, **report: Any
) -> list[dict[str, Any]]:
    """The weights objects after `first`: the claim in phase `claim`, the Job running with
    the fetcher's `report` (none if empty) and, if given, its pod's status."""
    out = []
    for obj in first.apply:
        if obj["kind"] not in (
            "PersistentVolumeClaim",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Job",
        ):
            continue
        live = copy.deepcopy(obj)
        if obj["kind"] == "PersistentVolumeClaim":
            live["status"] = {"phase": claim}
        if obj["kind"] == "Job":
            live["status"] = {"active": 1}
            if report:
                progress = WeightsProgress(repo=REPO_ID, revision="main", **report)
                live["metadata"]["annotations"] = {PROGRESS_ANNOTATION: progress.to_annotation()}
            if pod is not None:
                out.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"{obj['metadata']['name']}-abcde",
                            "labels": {
                                **obj["spec"]["template"]["metadata"]["labels"],
                                "job-name": obj["metadata"]["name"],
                            },
                        },
                        "status": pod,
                    }
                )
        out.append(live)
    return out


def _weights_ready(status: DSV4DeploymentStatus | DSV4ModelStatus) -> Condition:
    return next(c for c in status.conditions if c.type == "WeightsReady")


UNSCHEDULABLE = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims",
        }
    ],
}
FIGURES: dict[str, Any] = {"files_total": 4, "bytes_total": 700 * GIB}

CASES: dict[str, tuple[dict[str, Any], str, list[str]]] = {
    # (the weights' state, the WeightsReady reason, what its message says)
    "an unbound claim": ({"claim": "Pending"}, "Pending", ["claim", "is Pending, not bound"]),
    "an unschedulable download pod": (
        {"pod": UNSCHEDULABLE, "phase": "Planning"},
        "Pending",
        ["nothing downloads", "Unschedulable: 0/2 nodes are available"],
    ),
    "a running pod listing files": (
        {"pod": {"phase": "Running"}, "phase": "Planning"},
        "Pending",
        ["listing its files"],
    ),
    "a download with figures": (
        {"phase": "Downloading", "files_done": 1, "bytes_done": 12 * GIB, **FIGURES},
        "Downloading",
        ["downloading", "1/4 files, 12.0/700.0 GiB"],
    ),
    "a download without figures is no download": (
        {"phase": "Downloading", "files_done": 0, "bytes_done": 0},
        "Pending",
        ["nothing downloads"],
    ),
    "every byte on disk": (
        {"phase": "Downloading", "files_done": 4, "bytes_done": 700 * GIB, **FIGURES},
        "Verifying",
        ["verifying", "4/4 files"],
    ),
    "the fetcher verifying": (
        {"phase": "Verifying", "files_done": 4, "bytes_done": 700 * GIB, **FIGURES},
        "Verifying",
        ["verifying"],
    ),
    "a failed attempt retried": (
        {"phase": "Failed", "reason": "HubUnavailable", "message": "timed out"},
        "Pending",
        ["retrying after HubUnavailable: timed out"],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_weights_ready_says_what_the_download_does(
    variant: Callable[..., dict[str, Any]], case: str
) -> None:
    state, reason, said = CASES[case]
    spec = _hub(variant)
    deployment, _, second = _passes(spec, **state)
    condition = _weights_ready(second.status)
    assert (condition.status, condition.reason) == ("False", reason)
    for words in said:
        assert words in condition.message
    assert second.status.phase == ("Pending" if reason == "Pending" else "Downloading")
    # The deployment says what its model says, and waits.
    seen = decide(
        make_world(spec, weights=[_model(deployment, second.status)], status=deployment.status)
    )
    mirrored = _weights_ready(seen.status)
    assert (mirrored.reason, mirrored.message) == (reason, condition.message)
    assert seen.status.phase == "Progressing"


def test_verifying_never_goes_back_to_downloading(variant: Callable[..., dict[str, Any]]) -> None:
    spec = _hub(variant)
    deployment, first, verifying = _passes(
        spec, phase="Verifying", files_done=4, bytes_done=700 * GIB, **FIGURES
    )
    assert _weights_ready(verifying.status).reason == "Verifying"
    # A report of the same Job that reads like a download again (a retried pod re-listing).
    weights = _weights(first, phase="Downloading", files_done=3, bytes_done=600 * GIB, **FIGURES)
    again = decide_model(model_world(_model(deployment, verifying.status), weights=weights), IMAGE)
    assert _weights_ready(again.status).reason == "Verifying"


def test_a_missing_token_secret_is_refused_before_any_job(
    variant: Callable[..., dict[str, Any]],
) -> None:
    spec = _hub(variant, tokenSecret={"name": "hf-token", "key": "token"})
    deployment = decide(make_world(spec))
    model = _model(deployment)
    decision = decide_model(model_world(model, missing_secrets=frozenset({"hf-token"})), IMAGE)
    assert [o for o in decision.apply if o["kind"] == "Job"] == []
    condition = _weights_ready(decision.status)
    assert condition.reason == "TokenSecretMissing"
    assert "Secret hf-token" in condition.message and "'token'" in condition.message
    assert decision.status.phase == "Failed"
    assert [(n.type, n.reason) for n in decision.events if n.reason.startswith("Weights")] == [
        ("Warning", "WeightsTokenSecretMissing")
    ]
    assert decision.requeue_after is not None  # Secrets are not watched: look again
    # The deployment that uses the model fails with it, and says so once.
    seen = decide(
        make_world(spec, weights=[_model(deployment, decision.status)], status=deployment.status)
    )
    degraded = next(c for c in seen.status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "WeightsFailed")
    assert seen.status.phase == "Failed"
    assert [(n.type, n.reason) for n in seen.events if n.reason.startswith("Weights")] == [
        ("Warning", "WeightsTokenSecretMissing")
    ]

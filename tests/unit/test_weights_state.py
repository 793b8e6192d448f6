"""WeightsReady tells the truth (reconcile/weights.py through decide()): Pending while nothing
downloads (and why), Downloading only with figures, Verifying and never back, and a missing
token Secret refused before any Job exists."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dsv4_operator.api.status import Condition, DSV4DeploymentStatus
from dsv4_operator.reconcile.actions import Decision
from dsv4_operator.reconcile.decide import decide
from dsv4_operator.weights.progress import PROGRESS_ANNOTATION, WeightsProgress
from tests.support.builders import make_world

REPO_ID = "deepseek-ai/DeepSeek-V4-Flash"
GIB = 1 << 30


def _hub(variant: Callable[..., dict[str, Any]], **hub: Any) -> dict[str, Any]:
    return variant({"model.name": REPO_ID, "model.cache": {"huggingFace": hub}})


def _weights(
    first: Decision, claim: str = "Bound", pod: dict[str, Any] | None = None, **report: Any
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


def _weights_ready(status: DSV4DeploymentStatus) -> Condition:
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
FIGURES = {"files_total": 4, "bytes_total": 700 * GIB}

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
    first = decide(make_world(spec))
    second = decide(make_world(spec, weights=_weights(first, **state), status=first.status))
    condition = _weights_ready(second.status)
    assert (condition.status, condition.reason) == ("False", reason)
    for words in said:
        assert words in condition.message
    assert second.status.phase == "Progressing"


def test_verifying_never_goes_back_to_downloading(variant: Callable[..., dict[str, Any]]) -> None:
    spec = _hub(variant)
    first = decide(make_world(spec))
    verifying = decide(
        make_world(
            spec,
            weights=_weights(
                first, phase="Verifying", files_done=4, bytes_done=700 * GIB, **FIGURES
            ),
            status=first.status,
        )
    )
    assert _weights_ready(verifying.status).reason == "Verifying"
    # A report of the same Job that reads like a download again (a retried pod re-listing).
    again = decide(
        make_world(
            spec,
            weights=_weights(
                first, phase="Downloading", files_done=3, bytes_done=600 * GIB, **FIGURES
            ),
            status=verifying.status,
        )
    )
    assert _weights_ready(again.status).reason == "Verifying"


def test_a_missing_token_secret_is_refused_before_any_job(
    variant: Callable[..., dict[str, Any]],
) -> None:
    spec = _hub(variant, tokenSecret={"name": "hf-token", "key": "token"})
    decision = decide(make_world(spec, missing_secrets=frozenset({"hf-token"})))
    assert [o for o in decision.apply if o["kind"] == "Job"] == []
    condition = _weights_ready(decision.status)
    assert condition.reason == "TokenSecretMissing"
    assert "Secret hf-token" in condition.message and "'token'" in condition.message
    degraded = next(c for c in decision.status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "WeightsFailed")
    assert decision.status.phase == "Failed"
    assert [(n.type, n.reason) for n in decision.events if n.reason.startswith("Weights")] == [
        ("Warning", "WeightsTokenSecretMissing")
    ]
    assert decision.requeue_after is not None  # Secrets are not watched: look again

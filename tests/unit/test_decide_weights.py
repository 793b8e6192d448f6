"""decide() with weights from the Hugging Face Hub: a deployment naming a repo inline creates
the DSV4Model of its name and waits for it; the model (decide_model) downloads."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from dsv4_operator.api.models import DSV4ModelStatus
from dsv4_operator.api.status import Condition, DSV4DeploymentStatus
from dsv4_operator.reconcile.actions import Decision
from dsv4_operator.reconcile.decide import decide
from dsv4_operator.reconcile.model_decide import ModelDecision, decide_model
from dsv4_operator.weights.progress import PROGRESS_ANNOTATION, WeightsProgress
from tests.support.builders import as_live, make_world, model_world, stored_model

REPO_ID = "deepseek-ai/DeepSeek-V4-Flash"
IMAGE = "registry.example.com/dsv4-operator:test"
WEIGHTS_KINDS = ("PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding", "Job")


def _hub(variant: Callable[..., dict[str, Any]], revision: str = "main") -> dict[str, Any]:
    return variant({"model.name": REPO_ID, "model.cache": {"huggingFace": {"revision": revision}}})


def _live_weights(decision: ModelDecision, job_status: dict[str, Any] | None = None, **report: Any):  # type: ignore[no-untyped-def]
    """The model's weights objects as the API server holds them after `decision`, the Job
    with a status and the fetcher's annotation."""
    out = []
    for obj in decision.apply:
        if obj["kind"] in WEIGHTS_KINDS:
            live = copy.deepcopy(obj)
            if obj["kind"] == "Job":
                live["status"] = job_status or {"active": 1}
                if report:
                    progress = WeightsProgress(repo=REPO_ID, revision="main", **report)
                    live["metadata"].setdefault("annotations", {})[PROGRESS_ANNOTATION] = (
                        progress.to_annotation()
                    )
            out.append(live)
    return out


def _condition(status: DSV4DeploymentStatus | DSV4ModelStatus, type_: str) -> Condition:
    return next(c for c in status.conditions if c.type == type_)


def _engine_writes(decision: Decision) -> list[str]:
    return [o["kind"] for o in decision.apply if o["kind"] in ("StatefulSet", "Deployment")]


def _model(
    deployment: Decision,
    status: DSV4ModelStatus | None = None,
    generation: int = 1,
) -> dict[str, Any]:
    model = next(o for o in deployment.apply if o["kind"] == "DSV4Model")
    wire = status.to_wire() if status is not None else None
    return stored_model(model, generation=generation, status=wire)


def _model_pass(
    deployment: Decision, weights: list[dict[str, Any]], previous: ModelDecision | None = None
) -> ModelDecision:
    status = previous.status if previous is not None else None
    return decide_model(model_world(_model(deployment, status), weights=weights), IMAGE)


COMPLETE = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}


def test_a_fresh_deployment_creates_its_model_and_no_engine(
    variant: Callable[..., dict[str, Any]],
) -> None:
    decision = decide(make_world(_hub(variant)))
    [model] = decision.apply
    assert (model["kind"], model["metadata"]["name"]) == ("DSV4Model", "x")
    assert "ownerReferences" not in model["metadata"]  # deleting the deployment keeps it
    assert model["metadata"]["labels"]["dsv4.io/created-for"] == "x"
    assert model["spec"]["repo"] == REPO_ID and model["spec"]["revision"] == "main"
    weights = _condition(decision.status, "WeightsReady")
    assert (weights.status, weights.reason) == ("False", "Pending")
    ready = _condition(decision.status, "Ready")
    assert ready.reason == "WeightsNotReady" and REPO_ID in ready.message
    assert "WeightsPending" in {n.reason for n in decision.events}
    assert decision.waiting
    # The model's own first pass makes the download, owned by the model.
    first = decide_model(model_world(_model(decision)), IMAGE)
    assert sorted(o["kind"] for o in first.apply) == sorted(WEIGHTS_KINDS)
    for obj in first.apply:
        [owner] = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("DSV4Model", "x")
    assert first.finalizers == ["dsv4.io/model-in-use"]


def test_progress_is_in_the_condition_and_the_engines_wait(
    variant: Callable[..., dict[str, Any]],
) -> None:
    spec = _hub(variant)
    deployment = decide(make_world(spec))
    first = _model_pass(deployment, [])
    weights = _live_weights(
        first,
        phase="Downloading",
        files_done=3,
        files_total=170,
        bytes_done=12 << 30,
        bytes_total=700 << 30,
    )
    second = _model_pass(deployment, weights, first)
    condition = _condition(second.status, "WeightsReady")
    assert condition.reason == "Downloading"
    job = next(o for o in weights if o["kind"] == "Job")["metadata"]["name"]
    assert condition.message == (
        f"downloading {REPO_ID}@main: 3/170 files, 12.0/700.0 GiB (Job {job})"
    )
    assert second.apply == [] and second.delete == []
    assert [n.reason for n in second.events] == ["WeightsDownloading"]
    seen = decide(
        make_world(
            spec,
            weights=[_model(deployment, second.status)],
            status=deployment.status,
            revisions=deployment.create,
        )
    )
    assert _condition(seen.status, "WeightsReady").message == condition.message
    assert _engine_writes(seen) == [] and seen.writes == 0
    assert [n.reason for n in seen.events] == ["WeightsDownloading"]
    # Same reason as before: no Event again, from either.
    third = _model_pass(deployment, weights, second)
    assert third.events == [] and third.apply == []
    again = decide(
        make_world(
            spec,
            weights=[_model(deployment, third.status)],
            status=seen.status,
            revisions=deployment.create,
        )
    )
    assert again.events == [] and again.writes == 0


def test_a_completed_download_starts_the_engines(variant: Callable[..., dict[str, Any]]) -> None:
    spec = _hub(variant)
    deployment = decide(make_world(spec))
    first = _model_pass(deployment, [])
    weights = _live_weights(
        first,
        COMPLETE,
        phase="Complete",
        commit="0123456789abcdef0123456789abcdef01234567",
        files_done=4,
        files_total=4,
        bytes_done=1 << 30,
        bytes_total=1 << 30,
        message="verified (Checksum)",
    )
    done = _model_pass(deployment, weights, first)
    assert done.status.phase == "Ready"
    second = decide(
        make_world(spec, weights=[_model(deployment, done.status)], status=deployment.status)
    )
    assert sorted(_engine_writes(second)) == ["Deployment", "StatefulSet", "StatefulSet"]
    condition = _condition(second.status, "WeightsReady")
    assert (condition.status, condition.reason) == ("True", "Downloaded")
    assert "4/4 files" in condition.message and "0123456789ab" in condition.message
    sts = next(o for o in second.apply if o["kind"] == "StatefulSet")
    volume = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "models")
    assert volume["persistentVolumeClaim"] == {"claimName": "x-weights", "readOnly": True}


def test_a_failed_download_names_its_reason_and_what_to_do(
    variant: Callable[..., dict[str, Any]],
) -> None:
    spec = _hub(variant)
    deployment = decide(make_world(spec))
    first = _model_pass(deployment, [])
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}
    weights = _live_weights(
        first,
        failed,
        phase="Failed",
        reason="NotFound",
        message="404: repository deepseek-ai/DeepSeek-V4-Flash not found: check spec.model.name",
    )
    model = _model_pass(deployment, weights, first)
    assert model.status.phase == "Failed"
    second = decide(
        make_world(spec, weights=[_model(deployment, model.status)], status=deployment.status)
    )
    condition = _condition(second.status, "WeightsReady")
    assert (condition.status, condition.reason) == ("False", "NotFound")
    assert (
        "check spec.model.name" in condition.message and "delete it to retry" in condition.message
    )
    assert _engine_writes(second) == []
    for decision in (model, second):
        assert [(n.type, n.reason) for n in decision.events if n.reason.startswith("Weights")] == [
            ("Warning", "WeightsNotFound")
        ]


def test_a_new_revision_waits_for_its_weights_while_the_old_pair_serves(
    variant: Callable[..., dict[str, Any]],
) -> None:
    spec = _hub(variant)
    first = decide(make_world(spec))
    model_first = _model_pass(first, [])
    old_weights = _live_weights(model_first, COMPLETE)
    ready = _model_pass(first, old_weights, model_first)
    model = _model(first, ready.status)
    running = decide(make_world(spec, weights=[model], status=first.status))
    live = as_live(running.apply)
    settled = decide(
        make_world(spec, weights=[model], revisions=running.create, status=running.status, **live)
    )
    assert settled.writes == 0 and settled.status.phase == "Ready"

    # The deployment asks for v2: it changes its model's spec and, while the model still
    # reports v1 as downloaded, waits (its running pair keeps serving).
    newer = _hub(variant, revision="v2")
    moving = decide(
        make_world(newer, weights=[model], revisions=running.create, status=settled.status, **live)
    )
    assert [o["kind"] for o in moving.apply] == ["DSV4Model"]
    assert moving.apply[0]["spec"]["revision"] == "v2"
    assert _condition(moving.status, "WeightsReady").reason == "Pending"
    assert _condition(moving.status, "Ready").status == "True"  # still serving
    assert _condition(moving.status, "Progressing").reason == "WaitingForWeights"

    # The model takes v2 up: a new Job into the same claim; the v1 Job stays.
    changed = stored_model(moving.apply[0], generation=2, status=ready.status.to_wire())
    fetching = decide_model(model_world(changed, weights=old_weights), IMAGE)
    new_job = next(o for o in fetching.apply if o["kind"] == "Job")
    old_job = next(o for o in old_weights if o["kind"] == "Job")
    assert new_job["metadata"]["name"] != old_job["metadata"]["name"]
    assert fetching.delete == []
    assert _condition(fetching.status, "WeightsReady").reason == "Pending"
    waiting = decide(
        make_world(
            newer,
            weights=[{**changed, "status": fetching.status.to_wire()}],
            revisions=running.create,
            status=moving.status,
            **live,
        )
    )
    assert waiting.apply == []  # the model as wanted, no engine yet

    done = copy.deepcopy(new_job)
    done["status"] = COMPLETE
    finished = decide_model(
        model_world({**changed, "status": fetching.status.to_wire()}, weights=[*old_weights, done]),
        IMAGE,
    )
    # Older sources' Jobs stay (rollback targets start at once) up to KEPT_JOBS of them.
    assert not [name for res, name in finished.delete if res.kind == "Job"]
    rolling = decide(
        make_world(
            newer,
            weights=[{**changed, "status": finished.status.to_wire()}],
            revisions=running.create,
            status=moving.status,
            **live,
        )
    )
    assert "StatefulSet" in _engine_writes(rolling)
    aged = []
    for i, stamp in enumerate(
        ["2026-11-01T00:00:00Z", "2026-11-02T00:00:00Z", "2026-11-03T00:00:00Z"]
    ):
        job = copy.deepcopy(old_job)
        job["metadata"]["name"] = f"x-weights-old{i}"
        job["metadata"]["creationTimestamp"] = stamp
        aged.append(job)
    pruning = decide_model(
        model_world(
            {**changed, "status": finished.status.to_wire()},
            weights=[*old_weights, done, *aged],
        ),
        IMAGE,
    )
    deleted = sorted(name for res, name in pruning.delete if res.kind == "Job")
    # Four older Jobs: the original one (no timestamp: oldest) and old0 go; old1, old2 stay.
    assert deleted == sorted(["x-weights-old0", old_job["metadata"]["name"]])


def test_a_download_no_longer_wanted_is_stopped_at_once(
    variant: Callable[..., dict[str, Any]],
) -> None:
    first = decide(make_world(_hub(variant)))
    model_first = _model_pass(first, [])
    running_old = _live_weights(model_first, {"active": 1})
    old_job = next(o for o in running_old if o["kind"] == "Job")["metadata"]["name"]
    moved = decide(make_world(_hub(variant, revision="v2")))
    changed = stored_model(
        next(o for o in moved.apply if o["kind"] == "DSV4Model"),
        generation=2,
        status=model_first.status.to_wire(),
    )
    stopped = decide_model(model_world(changed, weights=running_old), IMAGE)
    assert [name for res, name in stopped.delete if res.kind == "Job"] == [old_job]
    assert _condition(stopped.status, "WeightsReady").reason == "Pending"

"""decide() with weights from the Hugging Face Hub: the rollout waits for the download Job."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from dsv4_operator.api.status import Condition, DSV4DeploymentStatus
from dsv4_operator.reconcile.actions import Decision
from dsv4_operator.weights.progress import PROGRESS_ANNOTATION, WeightsProgress
from tests.support.builders import as_live, make_world

REPO_ID = "deepseek-ai/DeepSeek-V4-Flash"


def _hub(variant: Callable[..., dict[str, Any]], revision: str = "main") -> dict[str, Any]:
    return variant({"model.name": REPO_ID, "model.cache": {"huggingFace": {"revision": revision}}})


def _live_weights(decision: Decision, job_status: dict[str, Any] | None = None, **report: Any):  # type: ignore[no-untyped-def]
    """The weights objects as the API server holds them after `decision`, the Job with a
    status and the fetcher's annotation."""
    out = []
    for obj in decision.apply:
        if obj["kind"] in ("PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding", "Job"):
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


def _condition(status: DSV4DeploymentStatus, type_: str) -> Condition:
    return next(c for c in status.conditions if c.type == type_)


def _engine_writes(decision: Decision) -> list[str]:
    return [o["kind"] for o in decision.apply if o["kind"] in ("StatefulSet", "Deployment")]


COMPLETE = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}


def test_a_fresh_deployment_creates_the_download_and_no_engine(
    variant: Callable[..., dict[str, Any]],
) -> None:
    decision = decide_hub(variant)
    kinds = sorted(o["kind"] for o in decision.apply)
    assert kinds == ["Job", "PersistentVolumeClaim", "Role", "RoleBinding", "ServiceAccount"]
    weights = _condition(decision.status, "WeightsReady")
    assert (weights.status, weights.reason) == ("False", "Pending")
    ready = _condition(decision.status, "Ready")
    assert ready.reason == "WeightsNotReady" and REPO_ID in ready.message
    assert "WeightsPending" in {n.reason for n in decision.events}
    assert decision.waiting


def decide_hub(variant: Callable[..., dict[str, Any]], **kw: Any) -> Decision:
    from dsv4_operator.reconcile.decide import decide

    return decide(make_world(_hub(variant), **kw))


def test_progress_is_in_the_condition_and_the_engines_wait(
    variant: Callable[..., dict[str, Any]],
) -> None:
    first = decide_hub(variant)
    weights = _live_weights(
        first,
        phase="Downloading",
        files_done=3,
        files_total=170,
        bytes_done=12 << 30,
        bytes_total=700 << 30,
    )
    second = decide_hub(variant, weights=weights, status=first.status, revisions=first.create)
    condition = _condition(second.status, "WeightsReady")
    assert condition.reason == "Downloading"
    assert condition.message == (
        f"downloading {REPO_ID}@main: 3/170 files, 12.0/700.0 GiB "
        f"(Job {next(o for o in weights if o['kind'] == 'Job')['metadata']['name']})"
    )
    assert _engine_writes(second) == [] and second.writes == 0
    assert [n.reason for n in second.events] == ["WeightsDownloading"]
    # Same reason as before: no Event again.
    third = decide_hub(variant, weights=weights, status=second.status, revisions=first.create)
    assert third.events == [] and third.writes == 0


def test_a_completed_download_starts_the_engines(variant: Callable[..., dict[str, Any]]) -> None:
    first = decide_hub(variant)
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
    second = decide_hub(variant, weights=weights, status=first.status)
    assert sorted(_engine_writes(second)) == ["Deployment", "StatefulSet", "StatefulSet"]
    condition = _condition(second.status, "WeightsReady")
    assert (condition.status, condition.reason) == ("True", "Downloaded")
    assert "4/4 files" in condition.message and "0123456789ab" in condition.message


def test_a_failed_download_names_its_reason_and_what_to_do(
    variant: Callable[..., dict[str, Any]],
) -> None:
    first = decide_hub(variant)
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}
    weights = _live_weights(
        first,
        failed,
        phase="Failed",
        reason="NotFound",
        message="404: repository deepseek-ai/DeepSeek-V4-Flash not found: check spec.model.name",
    )
    second = decide_hub(variant, weights=weights, status=first.status)
    condition = _condition(second.status, "WeightsReady")
    assert (condition.status, condition.reason) == ("False", "NotFound")
    assert (
        "check spec.model.name" in condition.message and "delete it to retry" in condition.message
    )
    assert _engine_writes(second) == []
    assert [(n.type, n.reason) for n in second.events if n.reason.startswith("Weights")] == [
        ("Warning", "WeightsNotFound")
    ]


def test_a_new_revision_waits_for_its_weights_while_the_old_pair_serves(
    variant: Callable[..., dict[str, Any]],
) -> None:
    from dsv4_operator.reconcile.decide import decide

    spec = _hub(variant)
    first = decide(make_world(spec))
    old_weights = _live_weights(first, COMPLETE)
    running = decide(make_world(spec, weights=old_weights, status=first.status))
    live = as_live(running.apply)
    settled = decide(
        make_world(
            spec, weights=old_weights, revisions=running.create, status=running.status, **live
        )
    )
    assert settled.writes == 0 and settled.status.phase == "Ready"

    newer = _hub(variant, revision="v2")
    moving = decide(
        make_world(
            newer, weights=old_weights, revisions=running.create, status=settled.status, **live
        )
    )
    assert _engine_writes(moving) == []  # the running pair is left alone
    new_job = next(o for o in moving.apply if o["kind"] == "Job")
    assert (
        new_job["metadata"]["name"]
        != next(o for o in old_weights if o["kind"] == "Job")["metadata"]["name"]
    )
    assert _condition(moving.status, "Ready").status == "True"  # still serving
    assert _condition(moving.status, "Progressing").reason == "WaitingForWeights"

    done = copy.deepcopy(new_job)
    done["status"] = COMPLETE
    both = [*old_weights, done]
    rolling = decide(
        make_world(newer, weights=both, revisions=running.create, status=moving.status, **live)
    )
    assert "StatefulSet" in _engine_writes(rolling)
    # Older sources' Jobs stay (rollback targets start at once) up to KEPT_JOBS of them.
    assert not [name for res, name in rolling.delete if res.kind == "Job"]
    aged = []
    for i, stamp in enumerate(
        ["2026-11-01T00:00:00Z", "2026-11-02T00:00:00Z", "2026-11-03T00:00:00Z"]
    ):
        job = copy.deepcopy(next(o for o in old_weights if o["kind"] == "Job"))
        job["metadata"]["name"] = f"x-weights-old{i}"
        job["metadata"]["creationTimestamp"] = stamp
        aged.append(job)
    pruning = decide(
        make_world(
            newer,
            weights=[*old_weights, done, *aged],
            revisions=running.create,
            status=moving.status,
            **live,
        )
    )
    deleted = sorted(name for res, name in pruning.delete if res.kind == "Job")
    # Four older Jobs: the original one (no timestamp: oldest) and old0 go; old1, old2 stay.
    assert deleted == sorted(
        ["x-weights-old0", next(o for o in old_weights if o["kind"] == "Job")["metadata"]["name"]]
    )


def test_a_download_no_longer_wanted_is_stopped_at_once(
    variant: Callable[..., dict[str, Any]],
) -> None:
    from dsv4_operator.reconcile.decide import decide

    first = decide(make_world(_hub(variant)))
    running_old = _live_weights(first, {"active": 1})
    old_job = next(o for o in running_old if o["kind"] == "Job")["metadata"]["name"]
    moved = decide(
        make_world(_hub(variant, revision="v2"), weights=running_old, status=first.status)
    )
    assert [name for res, name in moved.delete if res.kind == "Job"] == [old_job]
    assert _condition(moved.status, "WeightsReady").reason == "Pending"

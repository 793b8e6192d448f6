"""DSV4Model decisions: the finalizer and who holds it, a deployment that references a model
(missing, of another repo, ready: its claim and revision), and what a change enqueues."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from dsv4_operator.api.models import model_name_of
from dsv4_operator.guard.observations import Observations
from dsv4_operator.kube.resources import DSV4, DSV4_MODEL, JOB
from dsv4_operator.reconcile.decide import decide
from dsv4_operator.reconcile.model_decide import decide_model
from dsv4_operator.reconcile.pod_causes import PodWarnings
from dsv4_operator.runtime.specs import OwnerSpecs
from dsv4_operator.runtime.watched import enqueue_owner
from tests.support.builders import NOW, make_world, model_world, silent_pod, stored_model

REPO_ID = "deepseek-ai/DeepSeek-V4-Flash"
IMAGE = "registry.example.com/dsv4-operator:test"
FINALIZER = "dsv4.io/model-in-use"


def _model(
    name: str = "flash", status: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    manifest = {
        "apiVersion": "dsv4.io/v1alpha1",
        "kind": "DSV4Model",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"repo": REPO_ID, "revision": "v1", "storage": "190Gi", **spec},
    }
    return stored_model(manifest, status=status)


def _ready(name: str = "flash", **spec: Any) -> dict[str, Any]:
    """A model whose download is verified (its status as a pass writes it)."""
    status = {
        "phase": "Ready",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "WeightsReady",
                "status": "True",
                "reason": "Downloaded",
                "message": f"{REPO_ID}@v1: 4/4 files (Job {name}-weights-abc)",
            }
        ],
    }
    return _model(name, status, **spec)


def _referencing(variant: Callable[..., dict[str, Any]], model: str = "flash") -> dict[str, Any]:
    return variant({"model.name": REPO_ID, "model.cache": {"model": {"name": model}}})


def test_a_model_holds_its_finalizer_and_names_its_users() -> None:
    first = decide_model(model_world(_model(), users=["chat", "batch"]), IMAGE)
    assert first.finalizers == [FINALIZER]
    assert first.status.used_by == ["batch", "chat"]
    in_use = next(c for c in first.status.conditions if c.type == "InUse")
    assert (in_use.status, in_use.reason) == ("True", "Referenced")
    assert "batch, chat" in in_use.message
    held = model_world(_model(), finalizers=(FINALIZER,))
    unused = decide_model(held, IMAGE)
    assert unused.finalizers is None  # as it is
    assert [c.reason for c in unused.status.conditions if c.type == "InUse"] == ["Unused"]


def test_deleting_a_model_in_use_waits_and_says_for_whom() -> None:
    stored = _ready()
    weights = decide_model(model_world(stored), IMAGE).apply
    deleting = model_world(
        stored, users=["chat"], deleting=True, finalizers=(FINALIZER,), weights=weights
    )
    held = decide_model(deleting, IMAGE)
    assert held.finalizers is None and held.apply == []  # kept, nothing new made
    assert held.status.phase == "Terminating" and held.status.used_by == ["chat"]
    in_use = next(c for c in held.status.conditions if c.type == "InUse")
    assert (in_use.status, in_use.reason) == ("True", "DeletionWaits")
    assert "chat" in in_use.message
    assert [(n.type, n.reason) for n in held.events if n.reason == "ModelInUse"] == [
        ("Warning", "ModelInUse")
    ]
    # Once the deployment is gone the finalizer goes (the garbage collector does the rest).
    released = decide_model(
        model_world(stored, deleting=True, finalizers=(FINALIZER, "other")), IMAGE
    )
    assert released.finalizers == ["other"]


def test_a_deployment_referencing_a_missing_model_fails_and_says_which(
    variant: Callable[..., dict[str, Any]],
) -> None:
    decision = decide(make_world(_referencing(variant)))
    assert decision.apply == []  # never creates a referenced model
    weights = next(c for c in decision.status.conditions if c.type == "WeightsReady")
    assert weights.reason == "ModelMissing" and "DSV4Model flash" in weights.message
    assert decision.status.phase == "Failed"
    assert [n.reason for n in decision.events if n.reason.startswith("Weights")] == [
        "WeightsModelMissing"
    ]


def test_a_deployment_referencing_a_model_of_another_repo_says_so(
    variant: Callable[..., dict[str, Any]],
) -> None:
    other = _ready(repo="deepseek-ai/DeepSeek-V3.2")
    decision = decide(make_world(_referencing(variant), weights=[other]))
    weights = next(c for c in decision.status.conditions if c.type == "WeightsReady")
    assert weights.reason == "ModelMismatch" and "deepseek-ai/DeepSeek-V3.2" in weights.message
    assert [o for o in decision.apply if o["kind"] == "StatefulSet"] == []


def test_two_deployments_of_one_model_share_its_claim_and_make_no_download(
    variant: Callable[..., dict[str, Any]],
) -> None:
    model = _ready()
    for name in ("chat", "batch"):
        decision = decide(make_world(_referencing(variant), name=name, weights=[model]))
        kinds = {o["kind"] for o in decision.apply}
        assert not kinds & {"DSV4Model", "Job", "PersistentVolumeClaim"}
        engines = [o for o in decision.apply if o["kind"] == "StatefulSet"]
        assert engines, f"{name}: the engines start on a ready model"
        for sts in engines:
            pod = sts["spec"]["template"]["spec"]
            volume = next(v for v in pod["volumes"] if v["name"] == "models")
            assert volume["persistentVolumeClaim"] == {
                "claimName": "flash-weights",
                "readOnly": True,
            }
            command = " ".join(
                pod["containers"][0]["command"] + pod["containers"][0].get("args", [])
            )
            assert "--revision v1" in command  # the model's revision, not a default


def test_a_model_names_which_deployments_use_it() -> None:
    inline = {"metadata": {"name": "chat"}, "spec": {"model": {"cache": {"huggingFace": {}}}}}
    ref = {"metadata": {"name": "b"}, "spec": {"model": {"cache": {"model": {"name": "m"}}}}}
    pvc = {"metadata": {"name": "c"}, "spec": {"model": {"cache": {"pvc": {"claimName": "w"}}}}}
    assert [model_name_of(d) for d in (inline, ref, pvc, {})] == ["chat", "m", None, None]


class _Queue:
    def __init__(self) -> None:
        self.added: list[tuple[str, str]] = []

    def add(self, key: tuple[str, str], generation: int | None = None) -> None:
        self.added.append(key)

    def forget(self, key: tuple[str, str]) -> None:
        pass


class _Idle:
    """Guards, reconciler and leadership of a standby: the listener only enqueues."""

    def __init__(self) -> None:
        self.leading = self
        self.observations = Observations()

    def is_set(self) -> bool:
        return False

    def forget(self, key: tuple[str, str]) -> None:
        pass

    def stop(self, key: tuple[str, str]) -> None:
        pass

    def deleted(self, key: tuple[str, str]) -> None:
        pass


def test_a_model_change_wakes_its_users_and_a_deployment_change_its_model() -> None:
    queue, idle = _Queue(), _Idle()
    listener = enqueue_owner(queue, idle, idle, idle, OwnerSpecs())  # type: ignore[arg-type]
    model = _model(status={"usedBy": ["chat", "batch"]})
    listener(DSV4_MODEL, model, False)
    assert queue.added[0] == ("ns", "DSV4Model/flash")
    assert set(queue.added[1:]) == {("ns", "chat"), ("ns", "batch"), ("ns", "flash")}
    queue.added.clear()
    deployment = {
        "metadata": {"name": "chat", "namespace": "ns", "generation": 1},
        "spec": {"model": {"cache": {"model": {"name": "flash"}}}},
    }
    listener(DSV4, deployment, True)  # deleted: the model learns it lost a user
    assert ("ns", "DSV4Model/flash") in queue.added
    queue.added.clear()
    job: dict[str, Any] = {"metadata": {"name": "flash-weights-abc", "namespace": "ns"}}
    job["metadata"]["labels"] = {"dsv4.io/model": "flash"}
    listener(JOB, job, False)
    assert queue.added == [("ns", "DSV4Model/flash")]


def test_the_model_examples_are_valid_and_fit_together() -> None:
    import yaml

    from dsv4_operator.api.models import DSV4ModelSpec
    from dsv4_operator.engine.validation import validate_object
    from tests.support.paths import REPO

    model = yaml.safe_load((REPO / "examples" / "dsv4-model.yaml").read_text())
    deployment = yaml.safe_load((REPO / "examples" / "dsv4-on-model.yaml").read_text())
    spec = DSV4ModelSpec.model_validate(model["spec"])
    validation = validate_object(deployment)
    assert validation.valid and validation.spec is not None
    assert validation.spec.model.cache.model is not None
    assert validation.spec.model.cache.model.name == model["metadata"]["name"]
    assert validation.spec.model.name == spec.repo


def test_a_deleted_model_keeps_serving_its_users_while_its_status_catches_up(
    variant: Callable[..., dict[str, Any]],
) -> None:
    # The API server bumps a custom resource's generation when it sets deletionTimestamp.
    deleting = _ready()
    deleting["metadata"].update(generation=2, deletionTimestamp="2026-11-29T12:00:00Z")
    decision = decide(make_world(_referencing(variant), weights=[deleting]))
    weights = next(c for c in decision.status.conditions if c.type == "WeightsReady")
    assert (weights.status, weights.reason) == ("True", "Downloaded")
    # A new spec not yet taken up is another matter: the deployment waits for it.
    changed = _ready()
    changed["metadata"]["generation"] = 2
    waiting = decide(make_world(_referencing(variant), weights=[changed]))
    weights = next(c for c in waiting.status.conditions if c.type == "WeightsReady")
    assert (weights.status, weights.reason) == ("False", "Pending")


def test_a_weights_pod_stuck_with_nothing_in_its_status_gets_passes_for_its_events() -> None:
    """The download Job's pod waits on its claim (ContainerCreating): its Events say why
    (FailedMount), read 10 s in and again each minute; no watch event marks those moments."""
    pod = {"kind": "Pod", **silent_pod("2026-11-29T11:59:57Z", name="flash-weights-abc-x")}
    world = model_world(_model(), weights=[pod])
    assert decide_model(world, IMAGE).requeue_after == 8.0  # stuck at 10 s, and a second
    stuck = model_world(
        _model(),
        weights=[
            {**pod, "metadata": {**pod["metadata"], "creationTimestamp": "2026-11-29T11:50:00Z"}}
        ],
        pod_events={"flash-weights-abc-x": PodWarnings(NOW - timedelta(seconds=50))},
    )
    assert decide_model(stuck, IMAGE).requeue_after == 11.0

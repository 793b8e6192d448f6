"""The DSV4Model resource: a model's Hub weights as an object of its own (docs/models.md).

Its spec holds what `spec.model.cache.huggingFace` of a deployment holds (the repo, revision,
storage, token); the download Job, its progress, the verification and the claim belong to
it, so they outlive every deployment that serves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from dsv4_operator.api.base import ApiModel
from dsv4_operator.api.limits import Quantity
from dsv4_operator.api.model import HUB_REPO_ID, HuggingFaceSource
from dsv4_operator.api.pod import LocalObjectReference
from dsv4_operator.api.status import Condition

ModelPhase = Literal["Pending", "Downloading", "Ready", "Failed", "Terminating"]


class DSV4ModelSpec(HuggingFaceSource):
    """A model's weights from the Hugging Face Hub, downloaded once into a claim of its own."""

    repo: str = Field(
        min_length=3,
        max_length=193,
        pattern=HUB_REPO_ID.pattern,
        description="Hugging Face repo id (`organization/model`).",
    )
    checkpoint: str | None = Field(
        default=None,
        max_length=64,
        description="Checkpoint format of the weights (for people and `kubectl get`; a "
        "deployment's spec.model.checkpoint is what the planner reads).",
    )
    storage: Quantity = Field(
        description="Size of the claim: the weights plus headroom for a revision change's "
        "new blobs (a deployment naming the repo inline asks for 1.2 x its profile's weights).",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=16,
        description="Pull secrets of the download Job (it runs the operator's image).",
    )


class DSV4ModelStatus(ApiModel):
    """Where the download stands and who uses the weights; rebuilt on every pass."""

    phase: ModelPhase | None = Field(default=None, description="Summary of the conditions.")
    observed_generation: int | None = Field(
        default=None, description="The generation this status was computed for."
    )
    claim_name: str | None = Field(
        default=None, description="The PersistentVolumeClaim holding the weights."
    )
    used_by: list[str] = Field(
        default_factory=list,
        description="DSV4Deployments in this namespace that reference this model (their "
        "spec.model.cache.model, or an inline Hub repo that made it); while any does, "
        "deleting the model waits (finalizer dsv4.io/model-in-use).",
    )
    conditions: list[Condition] = Field(default_factory=list, description="WeightsReady, Ready.")


def parse_model_status(raw: object) -> DSV4ModelStatus:
    """The status as written by an earlier pass; empty when absent or unreadable."""
    if not isinstance(raw, dict):
        return DSV4ModelStatus()
    try:
        return DSV4ModelStatus.model_validate(raw)
    except ValueError:
        return DSV4ModelStatus()


def model_name_of(deployment: Mapping[str, Any]) -> str | None:
    """The DSV4Model a stored DSV4Deployment uses, read from its raw spec: the one
    spec.model.cache.model names, or (an inline Hub repo) the one named after it."""
    model = (deployment.get("spec") or {}).get("model") or {}
    cache = model.get("cache") if isinstance(model, dict) else None
    if not isinstance(cache, dict):
        return None
    ref = cache.get("model")
    if isinstance(ref, dict) and isinstance(ref.get("name"), str):
        return str(ref["name"])
    if cache.get("huggingFace") is not None:
        return str((deployment.get("metadata") or {}).get("name") or "") or None
    return None

"""The model to serve and where its weights live (`spec.model`)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from dsv4_operator.api.base import ApiModel
from dsv4_operator.api.limits import Quantity

# A Hub repo id, as huggingface_hub's validate_repo_id accepts it (`org/name`).
HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,95}/[A-Za-z0-9][-A-Za-z0-9_.]{0,95}$")


class PvcSource(ApiModel):
    """Model weights on a PersistentVolumeClaim."""

    claim_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Name of the PVC in the same namespace.",
    )
    read_only: bool = Field(default=True, description="Mount the claim read-only.")


class HostPathSource(ApiModel):
    """Model weights on a directory of the node."""

    path: str = Field(pattern=r"^/", max_length=4096, description="Absolute directory on the node.")


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]


class SecretKeyRef(ApiModel):
    """A key of a Secret in the deployment's namespace."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Secret name.",
    )
    key: str = Field(
        default="token",
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key in the Secret.",
    )


class HuggingFaceSource(ApiModel):
    """Weights downloaded from the Hugging Face Hub into a PVC the operator creates.

    spec.model.name is the repo id. The deployment creates (or adopts) the DSV4Model of its own
    name with these fields; the model's Job downloads the snapshot once (resumable; the Hub's
    file list gives the size up front) and verifies it; the engines start when it succeeded
    (condition WeightsReady). The claim belongs to the model and outlives the deployment.
    """

    revision: str = Field(
        default="main",
        min_length=1,
        max_length=255,
        pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$",
        description="Branch, tag or commit sha (sglang --revision).",
    )
    token_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding a Hub token (gated or private repos); HF_TOKEN of the "
        "download Job only, never of the engines.",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://\S+$",
        description="Hub endpoint (HF_ENDPOINT), for a mirror; defaults to huggingface.co.",
    )
    storage: Quantity | None = Field(
        default=None,
        description="Size of the claim; defaults to 1.2 x the profile's weight size "
        "(spec.model.weightsGiB when set).",
    )
    storage_class_name: str | None = Field(
        default=None, max_length=253, description="StorageClass of the claim."
    )
    access_modes: list[AccessMode] = Field(
        default_factory=lambda: list[AccessMode](["ReadWriteMany"]),
        min_length=1,
        max_length=3,
        description="Access modes of the claim; ReadWriteMany lets prefill and decode pods "
        "on different nodes share it.",
    )
    verify: Literal["Checksum", "Size"] = Field(
        default="Checksum",
        description="Checksum: every LFS file's sha256 against the Hub's; Size: sizes only.",
    )

    @model_validator(mode="after")
    def _storage_not_zero(self) -> HuggingFaceSource:
        if self.storage is not None and not _positive_quantity(self.storage):
            raise ValueError(
                f"spec.model.cache.huggingFace.storage {self.storage!r} must be more than 0 "
                "(the claim's size; leave it out for 1.2 x the weights)"
            )
        return self


def _positive_quantity(value: int | str) -> bool:
    """A quantity (QUANTITY_PATTERN) above zero: a digit 1-9 before any suffix or exponent."""
    if isinstance(value, int):
        return value > 0
    mantissa = re.match(r"^[0-9.]*", value)
    return mantissa is not None and re.search(r"[1-9]", mantissa.group()) is not None


class ModelRef(ApiModel):
    """A DSV4Model in the deployment's namespace (docs/models.md)."""

    kind: Literal["DSV4Model"] = Field(
        default="DSV4Model",
        max_length=64,
        description="DSV4Model (the only kind served today).",
    )
    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Name of the DSV4Model in the deployment's namespace.",
    )


class ModelCache(ApiModel):
    """Where the weights live; mounted at /models in every engine pod (HF_HOME)."""

    model_config = ApiModel.with_cel(
        {
            "rule": "[has(self.pvc), has(self.hostPath), has(self.huggingFace), has(self.model)]"
            ".filter(x, x).size() == 1",
            "message": "set exactly one of spec.model.cache.pvc, spec.model.cache.hostPath, "
            "spec.model.cache.huggingFace or spec.model.cache.model",
        }
    )

    pvc: PvcSource | None = Field(default=None, description="Weights on a PVC.")
    host_path: HostPathSource | None = Field(default=None, description="Weights on a node path.")
    hugging_face: HuggingFaceSource | None = Field(
        default=None,
        description="Weights downloaded from the Hugging Face Hub, into the DSV4Model named "
        "after this deployment (created, or adopted when it exists; kept when the deployment "
        "is deleted).",
    )
    model: ModelRef | None = Field(
        default=None,
        description="Weights of a DSV4Model in this namespace: its download and claim, "
        "shared with every deployment that references it.",
    )


class ModelSpec(ApiModel):
    """The model to serve."""

    name: str = Field(
        min_length=1, max_length=1024, description="Model path or hub id (sglang --model-path)."
    )
    served_name: str | None = Field(
        default=None,
        max_length=256,
        description="Name clients use (sglang --served-model-name); defaults to the profile name.",
    )
    profile: str = Field(
        default="deepseek-v4-flash",
        max_length=64,
        description="Built-in architecture profile the planner and rules use "
        "(`dsv4 rules` and the README list them): deepseek-v4-flash or deepseek-v3.2.",
    )
    checkpoint: str | None = Field(
        default=None,
        max_length=64,
        description="Checkpoint format of the weights, one of the profile's formats "
        "(deepseek-v4-flash: fp4-experts, nvfp4, fp8; deepseek-v3.2: fp8); "
        "defaults to the profile's default format.",
    )
    weights_gib: float | None = Field(
        default=None,
        alias="weightsGiB",
        gt=0,
        le=1 << 16,
        description="Override of the profile's weight size in GiB (all ranks together).",
    )
    cache: ModelCache = Field(description="Where the weights live.")

    @model_validator(mode="after")
    def _hub_repo_id(self) -> ModelSpec:
        hub = self.cache.hugging_face is not None or self.cache.model is not None
        if hub and not HUB_REPO_ID.match(self.name):
            raise ValueError(
                f"spec.model.name {self.name!r} must be a Hugging Face repo id "
                "(`organization/model`) when spec.model.cache.huggingFace or "
                "spec.model.cache.model is set"
            )
        return self

"""Kubernetes value types the spec shares (label keys and values, env names, tolerations),
with the checks the API server applies that a schema cannot express."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from dsv4_operator.api.base import ApiModel

# A label value (apimachinery's validation.IsValidLabelValue).
LabelValue = Annotated[
    str, Field(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
]
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _label_key(key: str) -> str:
    """apimachinery's IsQualifiedName, which a schema cannot express for a map's keys:
    `[prefix/]name`, the name at most 63 alphanumerics, '-', '_' or '.' (alphanumeric at both
    ends), the prefix a DNS subdomain of at most 253 characters."""
    prefix, slash, name = key.rpartition("/")
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        raise ValueError(
            f"key {key!r}: the name part must be 1-63 characters of [A-Za-z0-9-_.], "
            "alphanumeric at both ends (for example example.com/pool)"
        )
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise ValueError(
            f"key {key!r}: the prefix before '/' must be a lowercase DNS subdomain of at "
            "most 253 characters (for example example.com/pool)"
        )
    return key


_STANDARD_CONTAINER_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


def _resource_name(name: str) -> str:
    """A container resource the API server accepts: cpu, memory, ephemeral-storage,
    hugepages-<size>, or a fully qualified extended resource (`example.com/device`)."""
    if name in _STANDARD_CONTAINER_RESOURCES or name.startswith("hugepages-"):
        return name
    if "/" in name and "kubernetes.io/" not in name:
        _label_key(name)
        return name
    raise ValueError(
        f"resource {name!r}: use cpu, memory, ephemeral-storage, hugepages-<size> or a fully "
        "qualified extended resource (example.com/device)"
    )


# A container resource name (core/v1 validation of resource requirements).
ResourceName = Annotated[str, AfterValidator(_resource_name)]
# A label key (apimachinery's validation.IsQualifiedName).
LabelKey = Annotated[str, AfterValidator(_label_key)]
# Printable ASCII without '=' (what the API server accepts as an environment variable name).
ENV_NAME_PATTERN = r"^[!-<>-~]+$"


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, max_length=317, description="Taint key.")
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal."
    )
    value: LabelValue | None = Field(default=None, description="Taint value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, le=1 << 31, description="For NoExecute."
    )

    @model_validator(mode="after")
    def _as_the_api_server_checks(self) -> Toleration:
        # core/v1 validation (ValidateTolerations) the schema cannot express; caught here,
        # the pod template the operator renders would be refused by the API server.
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if not self.key and self.operator != "Exists":
            raise ValueError("operator must be Exists when key is empty")
        if self.key:
            _label_key(self.key)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds is only allowed with effect NoExecute")
        return self

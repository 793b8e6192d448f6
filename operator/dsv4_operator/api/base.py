"""Shared base for the API models: camelCase aliases, unknown fields refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict


class ApiModel(BaseModel):
    """Base of every spec/status model: camelCase on the wire, unknown fields are errors."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
        # .inf and .nan are valid YAML floats; no field of the API means either.
        allow_inf_nan=False,
    )

    @staticmethod
    def with_cel(*rules: JsonDict) -> ConfigDict:
        """The base config plus CRD `x-kubernetes-validations` (CEL) rules for this object."""
        return ConfigDict(
            **ApiModel.model_config,
            json_schema_extra={"x-kubernetes-validations": list(rules)},
        )

    def to_wire(self) -> dict[str, object]:
        """The object as it is stored in Kubernetes (camelCase, no unset optionals)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

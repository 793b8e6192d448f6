"""Shared base for the API models: camelCase aliases, unknown fields refused, durations."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict


class ApiModel(BaseModel):
    """Base of every spec/status model: camelCase on the wire, unknown fields are errors."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
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


_DURATION_RE = re.compile(r"^(\d+)(ms|s|m|h)$")
DURATION_PATTERN = _DURATION_RE.pattern
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, examples=["60s", "10m"]),
]


def parse_duration(text: str) -> timedelta:
    """Parse a Duration string such as `60s` or `10m` (the schema guarantees the shape)."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise ValueError(
            f"not a duration: {text!r}; use a number and one of ms, s, m, h (e.g. 10m)"
        )
    return timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])

"""Shared base for the API models: camelCase aliases, unknown fields refused, durations."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema


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


# At most 9 digits: every duration the pattern admits fits a timedelta and a Go
# time.Duration (999999999h would not fit the latter, but the bounds below cap far lower).
_DURATION_RE = re.compile(r"^([0-9]{1,9})(ms|s|m|h)$")
DURATION_PATTERN = _DURATION_RE.pattern
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class DurationBounds:
    """Annotated metadata: a Duration between two bounds, checked by pydantic and the CRD.

    The same two bounds produce the CEL rules the API server enforces (Kubernetes CEL has
    `duration()`, which reads these strings as Go durations) and the check pydantic runs, so
    `dsv4 validate`, the webhook and the API server refuse the same values.
    """

    minimum: str
    maximum: str

    def rules(self) -> list[JsonDict]:
        return [
            {
                "rule": f"duration(self) >= duration('{self.minimum}')",
                "message": f"must be at least {self.minimum}",
            },
            {
                "rule": f"duration(self) <= duration('{self.maximum}')",
                "message": f"must be at most {self.maximum}",
            },
        ]

    def _within(self, text: str) -> str:
        value = parse_duration(text)
        if value < parse_duration(self.minimum):
            raise ValueError(f"must be at least {self.minimum}")
        if value > parse_duration(self.maximum):
            raise ValueError(f"must be at most {self.maximum}")
        return text

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._within, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out["x-kubernetes-validations"] = self.rules()
        return out


# The shape every Duration field shares; its bounds come with a DurationBounds next to it:
# `Annotated[str, DURATION_SHAPE, DurationBounds("10s", "24h")]`.
DURATION_SHAPE = Field(pattern=DURATION_PATTERN, max_length=12, examples=["60s", "10m"])


def parse_duration(text: str) -> timedelta:
    """Parse a Duration string such as `60s` or `10m` (the schema guarantees the shape)."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise ValueError(
            f"not a duration: {text!r}; use a number and one of ms, s, m, h (e.g. 10m)"
        )
    return timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])

"""The API's times, parsed once where they enter: `Duration` (spec) and `Timestamp` (status).

Both are `str`s that keep the text as written, so the JSON of a spec or status (and the revision
hash computed from a spec) is byte for byte what it was; each carries its parsed value
(`Duration.delta`, `Timestamp.at`), which is what decisions read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Self

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.config import JsonDict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from dsv4_operator.names import format_time, parse_time

# At most 9 digits: every duration the pattern admits fits a timedelta and a Go
# time.Duration (999999999h would not fit the latter, but the bounds below cap far lower).
_DURATION_RE = re.compile(r"^([0-9]{1,9})(ms|s|m|h)$")
DURATION_PATTERN = _DURATION_RE.pattern
DURATION_MAX_LENGTH = 12
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> timedelta:
    """Parse a Duration string such as `60s` or `10m` (the schema guarantees the shape)."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise ValueError(
            f"not a duration: {text!r}; use a number and one of ms, s, m, h (e.g. 10m)"
        )
    return timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])


class Duration(str):
    """A duration of the spec as written (`60s`, `10m`), with its `delta`.

    Every duration field has this shape (the CRD's `pattern` and `maxLength`) and bounds of its
    own (`DurationBounds`): `Annotated[Duration, DurationBounds("10s", "24h")]`.
    """

    delta: timedelta

    def __new__(cls, text: str) -> Self:
        duration = super().__new__(cls, text)
        duration.delta = parse_duration(text)
        return duration

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        # The shape is checked on the string (as the API server does), then parsed once.
        shape = core_schema.str_schema(pattern=DURATION_PATTERN, max_length=DURATION_MAX_LENGTH)
        return core_schema.no_info_after_validator_function(cls, shape)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out["examples"] = ["60s", "10m"]
        return out


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

    def _within(self, value: Duration) -> Duration:
        if value.delta < parse_duration(self.minimum):
            raise ValueError(f"must be at least {self.minimum}")
        if value.delta > parse_duration(self.maximum):
            raise ValueError(f"must be at most {self.maximum}")
        return value

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


class Timestamp(str):
    """An RFC 3339 time as status stores it (`names.format_time`, as metav1.Time), with its
    `at`. A text that is no time does not validate (only the operator writes status)."""

    at: datetime

    def __new__(cls, text: str) -> Self:
        at = parse_time(text)
        if at is None:
            raise ValueError("an empty time")
        stamp = super().__new__(cls, text)
        stamp.at = at
        return stamp

    @classmethod
    def of(cls, at: datetime) -> Self:
        """`at` as status writes it (to the second)."""
        return cls(format_time(at))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(cls, core_schema.str_schema())

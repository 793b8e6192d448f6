"""A tool call's arguments against its tool's JSON schema: jsonschema's verdict, reached fast.

jsonschema (Draft 2020-12, as sglang's V4 detector uses) is the authority: its `best_match`
names the problem a `malformed_call` verdict quotes. It also costs about 40 us per call on a
two-property schema, 40% of classifying a short well-formed response (`bench/detector.py`).
So a schema whose keywords mean the same in every implementation is compiled a second time by
jsonschema-rs (under 1 us per call), and arguments it finds valid are valid; anything else
(invalid there, or a value it cannot take, such as a lone surrogate) goes to jsonschema, whose
verdict stands. Only a "valid" from jsonschema-rs is ever used, never an "invalid".

A schema with any of these keys, anywhere in it, is left to jsonschema alone:

- `$ref`, `$dynamicRef`, `$id`, `$anchor` and every other `$` keyword: jsonschema-rs resolves
  references itself and fetches remote ones over the network at compile time; jsonschema
  fetches nothing;
- `pattern`, `patternProperties`: Rust's regular expressions are not Python's;
- `format`, `content*`: whether they assert differs between implementations and drafts;
- `multipleOf`: floating-point division, done differently;
- `unevaluatedProperties`, `unevaluatedItems`, `dependencies`: annotation tracking and a
  keyword older drafts spelled differently, where implementations have disagreed.

The keys are looked for by walking the whole schema as JSON, property names included: a
property named `format` sends its tool to jsonschema alone, which is slower, never wrong.
`tests/unit/test_tool_arguments.py` holds the two paths to the same verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, best_match

_SLOW_ONLY_KEYS = frozenset(
    {
        "pattern",
        "patternProperties",
        "format",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        "multipleOf",
        "unevaluatedProperties",
        "unevaluatedItems",
        "dependencies",
    }
)


class InvalidSchema(ValueError):
    """The schema is not a valid Draft 2020-12 schema; the message says why."""


def fast_path_allowed(schema: Any) -> bool:
    """True when no key of `schema`, at any depth, is a `$` keyword or in `_SLOW_ONLY_KEYS`."""
    stack = [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str) or key.startswith("$") or key in _SLOW_ONLY_KEYS:
                    return False
                stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)
    return True


class ArgumentSchema:
    """One tool's parameters schema, checked once and compiled for both paths."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as error:
            raise InvalidSchema(error.message) from error
        self._validator = Draft202012Validator(schema)
        self._fast: jsonschema_rs.Draft202012Validator | None = None
        if fast_path_allowed(schema):
            try:
                self._fast = jsonschema_rs.Draft202012Validator(dict(schema))
            except (ValueError, jsonschema_rs.ValidationError):
                self._fast = None  # a schema it cannot take: jsonschema alone

    @property
    def fast(self) -> bool:
        """Whether arguments are tried on jsonschema-rs first."""
        return self._fast is not None

    def problem(self, arguments: Any) -> ValidationError | None:
        """jsonschema's most relevant error for `arguments` (parsed JSON), None when valid."""
        if self._fast is not None:
            try:
                if self._fast.is_valid(arguments):
                    return None
            except (ValueError, TypeError, OverflowError):
                pass  # a value it cannot convert: jsonschema decides
        problem: ValidationError | None = best_match(self._validator.iter_errors(arguments))
        return problem

"""The CLI's JSON contract: each command's output against its schema in docs/schemas."""

from __future__ import annotations

import json
import re
from typing import Any

from jsonschema import Draft202012Validator

from tests.support.paths import REPO

SCHEMAS = REPO / "docs" / "schemas"
CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")


def schema(command: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMAS / f"{command}.schema.json").read_text())
    return loaded


def keys(node: Any) -> set[str]:
    """Every object key anywhere in a JSON value."""
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in keys(v)}
    return set()


def assert_contract(command: str, payload: Any) -> None:
    """`payload` matches `command`'s schema and every key in it is camelCase."""
    errors = sorted(
        Draft202012Validator(schema(command)).iter_errors(payload), key=lambda e: e.json_path
    )
    assert not errors, "\n".join(f"{e.json_path}: {e.message}" for e in errors)
    assert not {k for k in keys(payload) if not CAMEL.match(k)}, "keys that are not camelCase"

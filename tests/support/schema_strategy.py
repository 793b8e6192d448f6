"""A hypothesis strategy for documents that follow a CRD's structural schema (the subset the
generated DSV4Deployment CRD uses): the fuzz test's second source of input, next to
mutations of the examples."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

MAX_ITEMS = 3  # lists and maps stay small: the point is shape, not volume


def from_structural(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that satisfy `schema`'s types, enums, bounds, lengths and patterns (CEL rules
    and cross-field constraints are left to the code under test)."""
    strategy = _typed(schema)
    if schema.get("nullable"):
        strategy = st.one_of(st.none(), strategy)
    return strategy


def _typed(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get("x-kubernetes-int-or-string"):
        text = _string({k: v for k, v in schema.items() if k in ("pattern", "maxLength")})
        return st.one_of(st.integers(min_value=0, max_value=1 << 20), text)
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=2)
    kind = schema.get("type")
    if kind == "object":
        return _object(schema)
    if kind == "array":
        items = from_structural(schema.get("items", {}))
        size = min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS)
        unique = schema.get("x-kubernetes-list-type") == "set"
        return st.lists(items, max_size=size, unique=unique)
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        return st.integers(
            min_value=schema.get("minimum", -(1 << 31)), max_value=schema.get("maximum", 1 << 31)
        )
    if kind == "number":
        low, high = schema.get("minimum", -1e9), schema.get("maximum", 1e9)
        return st.floats(
            min_value=low,
            max_value=high,
            exclude_min=bool(schema.get("exclusiveMinimum")),
            exclude_max=bool(schema.get("exclusiveMaximum")),
            allow_nan=False,
        )
    if kind == "boolean":
        return st.booleans()
    return st.none()


def _string(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    limit = schema.get("maxLength", 40)
    if "pattern" in schema:
        text = st.from_regex(schema["pattern"], fullmatch=True)
    else:
        text = st.text(max_size=min(limit, 40))
    minimum = schema.get("minLength", 0)
    return text.filter(lambda s: minimum <= len(s) <= limit)


def _object(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties: dict[str, Any] = schema.get("properties", {})
    if not properties:
        extra = schema.get("additionalProperties")
        values = from_structural(extra) if isinstance(extra, dict) else st.text(max_size=8)
        size = min(schema.get("maxProperties", MAX_ITEMS), MAX_ITEMS)
        return st.dictionaries(st.text(min_size=1, max_size=12), values, max_size=size)
    required = set(schema.get("required", []))
    fields = {name: from_structural(sub) for name, sub in properties.items()}
    return st.fixed_dictionaries(
        {k: v for k, v in fields.items() if k in required},
        optional={k: v for k, v in fields.items() if k not in required},
    )

"""Hypothesis strategies for DSV4Deployment documents that stay close to valid: same-typed
changes of the example (`gentle`) and the example with a field drawn from the CRD's own schema
(`from_the_crd`). The CLI fuzz test runs them through `dsv4`; the dry-run test through a real
API server."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from dsv4_operator.api.crd import openapi_schema
from tests.support.builders import example_doc
from tests.support.schema_strategy import from_structural


def paths_in(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into `node` (keys and list indexes), the empty one first."""
    out = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            out += paths_in(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            out += paths_in(child, (*prefix, index))
    return out


def _alike(draw: st.DrawFn, value: Any) -> Any:
    """A value of the same type near `value`: most of these keep the spec valid."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return draw(st.integers(min_value=0, max_value=2 * value + 8))
    if isinstance(value, float):
        return draw(st.floats(min_value=0.0, max_value=2 * value + 1.0))
    if isinstance(value, str):
        return draw(st.sampled_from([value, value.upper(), value + "x", "", "fp8", "bf16"]))
    return value


@st.composite
def gentle(draw: st.DrawFn) -> dict[str, Any]:
    """One same-typed change of the safe example's spec."""
    safe = example_doc()
    leaves = [p for p in paths_in(safe["spec"]) if p]
    path = draw(st.sampled_from(leaves))
    node: Any = safe["spec"]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = _alike(draw, node[path[-1]])
    return safe


SPEC_SCHEMA = openapi_schema()["properties"]["spec"]


def _schema_paths(
    schema: dict[str, Any], prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    out = []
    for name, sub in schema.get("properties", {}).items():
        out.append(((*prefix, name), sub))
        out += _schema_paths(sub, (*prefix, name))
    return out


SCHEMA_PATHS = _schema_paths(SPEC_SCHEMA)


@st.composite
def from_the_crd(draw: st.DrawFn) -> dict[str, Any]:
    """The safe example with one field (any depth) drawn from the CRD's schema for it, or a
    whole spec drawn from the schema."""
    doc = example_doc()
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        doc["spec"] = draw(from_structural(SPEC_SCHEMA))
        return doc
    path, schema = draw(st.sampled_from(SCHEMA_PATHS))
    node: dict[str, Any] = doc["spec"]
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = draw(from_structural(schema))
    return doc

"""Tool-call arguments get jsonschema's verdict whether or not jsonschema-rs saw them first.

Schemas are drawn from the keywords `leak/arguments.py` lets through to jsonschema-rs, nested,
with bounds at the edges of the drawn values (so both verdicts come up); arguments are any
JSON, big integers, floats with and without a fraction, booleans where numbers are expected
and lone surrogates among them. The oracle is jsonschema alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from dsv4_operator.leak.arguments import ArgumentSchema, InvalidSchema, fast_path_allowed
from dsv4_operator.leak.classifier import InvalidToolSchema, classify_response

NAMES = st.sampled_from(["a", "b", "city", "n", "ok"])
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "null", "array", "object"])
NUMBERS = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([2**63, 2**64 + 1, -(2**63) - 1, 10**30]),
    st.floats(-3, 3, allow_nan=False).map(lambda f: round(f, 1)),
    st.sampled_from([1.0, -0.0, 2.5]),
)
LETTERS = st.sampled_from("ab é😀")
SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)


def _json(strings: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.one_of(st.none(), st.booleans(), NUMBERS, strings),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(NAMES, inner, max_size=3)
        ),
        max_leaves=8,
    )


# json.loads gives lone surrogates in arguments; a schema with one is jsonschema's alone.
JSON = _json(st.text(st.one_of(LETTERS, SURROGATES), max_size=4))
SCHEMA_JSON = _json(st.text(LETTERS, max_size=4))


def _leaf_keywords() -> st.SearchStrategy[dict[str, Any]]:
    counts = st.integers(0, 3)
    return st.fixed_dictionaries(
        {},
        optional={
            "type": st.one_of(TYPES, st.lists(TYPES, min_size=1, max_size=3, unique=True)),
            "enum": st.lists(SCHEMA_JSON, min_size=1, max_size=3),
            "const": SCHEMA_JSON,
            "minimum": NUMBERS,
            "maximum": NUMBERS,
            "exclusiveMinimum": NUMBERS,
            "exclusiveMaximum": NUMBERS,
            "minLength": counts,
            "maxLength": counts,
            "minItems": counts,
            "maxItems": counts,
            "uniqueItems": st.booleans(),
            "minProperties": counts,
            "maxProperties": counts,
            "required": st.lists(NAMES, max_size=2, unique=True),
            "dependentRequired": st.dictionaries(NAMES, st.lists(NAMES, max_size=2, unique=True)),
            "description": st.text(LETTERS, max_size=5),
        },
    )


def _schemas() -> st.SearchStrategy[Any]:
    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        subschemas = st.lists(inner, min_size=1, max_size=2)
        return st.tuples(
            _leaf_keywords(),
            st.fixed_dictionaries(
                {},
                optional={
                    "properties": st.dictionaries(NAMES, inner, max_size=3),
                    "additionalProperties": inner,
                    "propertyNames": inner,
                    "items": inner,
                    "prefixItems": subschemas,
                    "contains": inner,
                    "anyOf": subschemas,
                    "oneOf": subschemas,
                    "allOf": subschemas,
                    "not": inner,
                    "if": inner,
                    "then": inner,
                    "else": inner,
                    "dependentSchemas": st.dictionaries(NAMES, inner, max_size=2),
                },
            ),
        ).map(lambda parts: {**parts[0], **parts[1]})

    return st.recursive(st.one_of(st.booleans(), _leaf_keywords()), extend, max_leaves=6)


def _cases(cases: int) -> settings:
    return settings(
        max_examples=cases,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )


def _same_verdict(schema: Any, arguments: Any) -> None:
    if isinstance(schema, bool):
        schema = {"allOf": [schema]}
    checked = ArgumentSchema(schema)
    assert checked.fast  # every drawn keyword is one the fast path takes
    expected = best_match(Draft202012Validator(schema).iter_errors(arguments))
    got = checked.problem(arguments)
    event("valid" if expected is None else "invalid")
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert (got.message, list(got.absolute_path)) == (
            expected.message,
            list(expected.absolute_path),
        )


@_cases(250)
@given(schema=_schemas(), arguments=JSON)
def test_both_paths_give_jsonschemas_verdict_and_message(schema: Any, arguments: Any) -> None:
    _same_verdict(schema, arguments)


@pytest.mark.nightly
@_cases(5_000)
@given(schema=_schemas(), arguments=JSON)
def test_both_paths_give_jsonschemas_verdict_nightly(schema: Any, arguments: Any) -> None:
    _same_verdict(schema, arguments)


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "http://127.0.0.1:9/remote.json"},  # jsonschema-rs would fetch it
        {"$defs": {"x": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/x"}}},
        {"properties": {"a": {"type": "string", "pattern": "^\\w+$"}}},
        {"patternProperties": {"^x": {"type": "integer"}}},
        {"properties": {"at": {"type": "string", "format": "date-time"}}},
        {"properties": {"n": {"type": "number", "multipleOf": 0.1}}},
        {"unevaluatedProperties": False},
        {"properties": {"format": {"type": "string"}}},  # a property name: slower, not wrong
    ],
)
def test_schemas_whose_meaning_depends_on_the_implementation_stay_with_jsonschema(
    schema: dict[str, Any],
) -> None:
    assert not fast_path_allowed(schema)
    assert not ArgumentSchema(schema).fast


def test_a_schema_jsonschema_rs_cannot_take_is_left_to_jsonschema() -> None:
    checked = ArgumentSchema({"enum": ["\ud800"]})  # a lone surrogate: no Rust string
    assert fast_path_allowed({"enum": ["\ud800"]}) and not checked.fast
    assert checked.problem("\ud800") is None
    assert checked.problem("x") is not None


def test_a_pattern_is_judged_by_pythons_regular_expressions() -> None:
    # \Z is end-of-string in Python only: jsonschema-rs's dialect reads it otherwise.
    checked = ArgumentSchema({"properties": {"a": {"type": "string", "pattern": "^ab\\Z"}}})
    assert checked.problem({"a": "ab"}) is None
    problem = checked.problem({"a": "abc"})
    assert problem is not None and "does not match" in problem.message


def test_an_invalid_schema_is_refused_with_jsonschemas_reason() -> None:
    with pytest.raises(InvalidSchema, match="is not valid under any of the given schemas"):
        ArgumentSchema({"type": "strin"})
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"minLength": -1}}}]
    response = {"choices": [{"message": {"content": "x"}}]}
    with pytest.raises(InvalidToolSchema, match="tool 'f' has an invalid JSON schema: -1"):
        classify_response(response, tools=tools, must_call=False)


def test_equal_tools_share_one_compiled_set_and_different_ones_do_not() -> None:
    def tools(type_: Any) -> list[dict[str, Any]]:
        parameters = {"type": "object", "properties": {"n": {"type": type_}}}
        return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]

    def verdict(tools: list[dict[str, Any]], arguments: str) -> str:
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
        response = {"choices": [{"message": {"content": "", "tool_calls": [call]}}]}
        return classify_response(response, tools=tools, must_call=True).kind.value

    assert verdict(tools("integer"), '{"n": 1}') == "ok"
    assert verdict(tools("string"), '{"n": 1}') == "malformed_call"  # not the cached set
    assert verdict(tools(["integer"]), '{"n": "x"}') == "malformed_call"
    assert verdict(tools(["integer", "string"]), '{"n": "x"}') == "ok"

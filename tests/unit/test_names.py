"""The one module of names, and the CRD's CEL rules evaluated from the CRD's own expressions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dsv4_operator.api.cel import CelRule, UnsupportedRule, broken, rules_of, spec_rules
from dsv4_operator.api.crd import custom_resource_definition
from dsv4_operator.names import (
    API_VERSION,
    MAIN_PAIR,
    child_name,
    format_time,
    parse_time,
    revision_name,
    router_name,
    router_url,
)


def test_child_names() -> None:
    assert child_name("x", "decode") == "x-decode"
    assert child_name("x", "decode", MAIN_PAIR) == "x-decode"
    assert child_name("x", "decode", "abc123") == "x-decode-abc123"
    assert child_name("x", "router", "abc123") == router_name("x") == "x-router"
    assert revision_name("x", "abc123") == "x-abc123"
    assert router_url("x", "ns", 8000) == "http://x-router.ns.svc:8000"


def test_time_round_trip() -> None:
    at = datetime(2026, 11, 29, 12, 0, 5, tzinfo=UTC)
    assert format_time(at) == "2026-11-29T12:00:05Z"
    assert parse_time(format_time(at)) == at
    assert parse_time(None) is None and parse_time("") is None


def test_crd_carries_the_names() -> None:
    crd = custom_resource_definition()
    assert f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}" == API_VERSION


def test_every_crd_rule_is_understood() -> None:
    crd = custom_resource_definition()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = spec_rules()
    assert len(rules) == len(rules_of(schema, "spec")) >= 4
    assert {r.field for r in rules} >= {
        "spec.model.cache",
        "spec.workload.contextTokens",
        "spec.transfer.bootstrapPort",
    }


def _rule(expression: str, field_path: str = "") -> CelRule:
    entry: dict[str, Any] = {"rule": expression, "message": "m"}
    if field_path:
        entry["fieldPath"] = field_path
    return CelRule.compile(entry, (), "spec")


@pytest.mark.parametrize(
    ("expression", "obj", "holds"),
    [
        ("has(self.a) != has(self.b)", {"a": 1}, True),
        ("has(self.a) != has(self.b)", {"a": 1, "b": 2}, False),
        ("has(self.a) != has(self.b)", {}, False),
        ("self.a.b <= self.c", {"a": {"b": 3}, "c": 3}, True),
        ("self.a.b <= self.c", {"a": {"b": 4}, "c": 3}, False),
        ("self.port != 30000", {"port": 30000}, False),
        ("self.mode == 'x'", {"mode": "x"}, True),
        ("self.a < self.b", {"a": 1}, True),  # absent: not judged here
        ("[has(self.a), has(self.b), has(self.c)].filter(x, x).size() == 1", {"b": 1}, True),
        ("[has(self.a), has(self.b), has(self.c)].filter(x, x).size() == 1", {}, False),
        (
            "[has(self.a), has(self.b), has(self.c)].filter(x, x).size() == 1",
            {"a": 1, "c": {}},
            False,
        ),
    ],
)
def test_cel_subset(expression: str, obj: dict[str, Any], holds: bool) -> None:
    assert _rule(expression).holds(obj) is holds


def test_unsupported_cel_fails_loudly() -> None:
    with pytest.raises(UnsupportedRule):
        _rule("self.items.all(i, i > 0)")
    with pytest.raises(UnsupportedRule):
        _rule("size(self.a) > 0")


def test_broken_rules_report_the_crd_field_and_message() -> None:
    schema = {
        "type": "object",
        "properties": {
            "inner": {
                "type": "object",
                "x-kubernetes-validations": [{"rule": "self.a != 1", "message": "a is 1"}],
            }
        },
        "x-kubernetes-validations": [
            {"rule": "self.n <= self.m", "message": "n above m", "fieldPath": ".n"}
        ],
    }
    rules = rules_of(schema, "spec")
    wire = {"inner": {"a": 1}, "n": 2, "m": 1}
    assert [(r.field, r.message) for r in broken(rules, wire)] == [
        ("spec.inner", "a is 1"),
        ("spec.n", "n above m"),
    ]
    assert broken(rules, {"n": 0, "m": 1}) == []  # an absent object is not judged

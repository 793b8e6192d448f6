"""The CRD's CEL rules, evaluated in Python from the CRD's own expressions.

The rules are written once, on the models (`ApiModel.with_cel`), and land in the generated
CRD as `x-kubernetes-validations`; the API server enforces them there. `dsv4 validate` and
the reconcile loop read the same expressions back from the generated schema and evaluate
them here, so the two can never disagree on wording or on what a rule checks.

Only the small part of CEL the rules use is understood: `has(self.a.b)`, field paths
`self` and `self.a.b`, integer, string and boolean literals, `duration(...)` of a path or a
literal, how many of a list of `has(...)` hold (`[has(self.a), has(self.b)].filter(x, x).size()`),
and one comparison (`==`, `!=`, `<`, `<=`, `>`, `>=`). A rule outside that subset
fails loudly when the table is built (a unit test builds it), so a new rule cannot be silently
skipped.

A rule whose message names a DSV4 rule id (for example `(DSV4-R007)`) is the API server's
copy of that rule: the rule engine reports it with its own id, so it is not reported twice.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from dsv4_operator.api.crd import openapi_schema
from dsv4_operator.api.times import parse_duration

_RULE_ID = re.compile(r"\(DSV4-R\d+\)")
_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
_COMPARISON = re.compile(r"^\s*(.+?)\s*(==|!=|<=|>=|<|>)\s*(.+?)\s*$")
_PATH = r"self((?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
_HAS = re.compile(rf"^has\({_PATH}\)$")
_FIELD = re.compile(rf"^{_PATH}$")
_DURATION = re.compile(r"^duration\((.+)\)$")
_COUNT = re.compile(r"^\[(.+)\]\.filter\(x, x\)\.size\(\)$")
_MISSING = object()

Operand = Callable[[Mapping[str, Any]], Any]


class UnsupportedRule(ValueError):
    """A CEL expression outside the subset this evaluator understands."""


def _lookup(node: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _operand(text: str, rule: str) -> Operand:
    if match := _DURATION.match(text):
        inner = _operand(match.group(1), rule)

        def as_duration(obj: Any) -> Any:
            value = inner(obj)
            if not isinstance(value, str):
                return _MISSING
            try:
                return parse_duration(value)
            except ValueError:
                return _MISSING  # the field's pattern reports the shape

        return as_duration
    if match := _COUNT.match(text):
        flags = [_operand(part.strip(), rule) for part in match.group(1).split(",")]
        return lambda obj: sum(1 for flag in flags if flag(obj) is True)
    if match := _HAS.match(text):
        path = tuple(match.group(1).split(".")[1:])
        return lambda obj: _lookup(obj, path) is not _MISSING
    if match := _FIELD.match(text):
        path = tuple(match.group(1).split(".")[1:])
        return lambda obj: _lookup(obj, path)
    if re.fullmatch(r"-?\d+", text):
        number = int(text)
        return lambda obj: number
    if text in ("true", "false"):
        flag = text == "true"
        return lambda obj: flag
    if re.fullmatch(r"'[^']*'|\"[^\"]*\"", text):
        literal = text[1:-1]
        return lambda obj: literal
    raise UnsupportedRule(f"CEL operand {text!r} of rule {rule!r} is not supported")


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` entry, where it sits, and how to evaluate it."""

    rule: str
    message: str
    field: str  # the reported field: the node's path plus the rule's fieldPath
    node: tuple[str, ...]  # wire path from the schema root to the object the rule is on
    left: Operand
    compare: Callable[[Any, Any], bool]
    right: Operand

    @classmethod
    def compile(cls, entry: Mapping[str, Any], node: tuple[str, ...], root: str) -> CelRule:
        rule = str(entry["rule"])
        match = _COMPARISON.match(rule)
        if match is None:
            raise UnsupportedRule(f"CEL rule {rule!r} is not a single comparison")
        left, op, right = match.groups()
        where = ".".join((root, *node)) + str(entry.get("fieldPath", ""))
        return cls(
            rule=rule,
            message=str(entry.get("message", f"failed rule: {rule}")),
            field=where,
            node=node,
            left=_operand(left, rule),
            compare=_COMPARISONS[op],
            right=_operand(right, rule),
        )

    @property
    def mirrors_a_dsv4_rule(self) -> bool:
        return _RULE_ID.search(self.message) is not None

    def holds(self, obj: Mapping[str, Any]) -> bool:
        """True when the rule holds for `obj` (the wire form of the object it sits on).

        A field that is absent cannot be compared: such a rule is not counted as broken here
        (the schema's own required/default handling speaks for it).
        """
        left, right = self.left(obj), self.right(obj)
        if left is _MISSING or right is _MISSING:
            return True
        return bool(self.compare(left, right))


def _walk(schema: Mapping[str, Any], node: tuple[str, ...], root: str) -> Iterator[CelRule]:
    """Children first, then the node's own rules (so nested objects report first)."""
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, (*node, name), root)
    if "items" in schema or isinstance(schema.get("additionalProperties"), Mapping):
        inner = schema.get("items") or schema["additionalProperties"]
        if any(True for _ in _walk(inner, (), root)):
            raise UnsupportedRule(f"CEL rules inside a list or map at {node} are not supported")
    for entry in schema.get("x-kubernetes-validations", []):
        yield CelRule.compile(entry, node, root)


def rules_of(schema: Mapping[str, Any], root: str) -> tuple[CelRule, ...]:
    """Every CEL rule of a structural schema, with wire paths relative to `root`."""
    return tuple(_walk(schema, (), root))


@cache
def spec_rules() -> tuple[CelRule, ...]:
    """The CEL rules of `.spec` in the generated CRD."""
    return rules_of(openapi_schema()["properties"]["spec"], "spec")


def broken(rules: tuple[CelRule, ...], wire: Mapping[str, Any]) -> list[CelRule]:
    """The rules that do not hold for `wire`, in table order (objects that are absent skip)."""
    out: list[CelRule] = []
    for rule in rules:
        obj = _lookup(wire, rule.node)
        if obj is not _MISSING and not rule.holds(obj):
            out.append(rule)
    return out


def broken_spec_rules(spec_wire: Mapping[str, Any]) -> list[CelRule]:
    """The spec's CEL rules that `spec_wire` breaks, except copies of DSV4 rules."""
    return [r for r in broken(spec_rules(), spec_wire) if not r.mirrors_a_dsv4_rule]

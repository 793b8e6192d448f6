"""The alert rules and the dashboard speak the exporters' label vocabulary (series.py): every
expression over a deployment's series groups, joins and selects on `namespace` and the bare
`deployment` name, so the operator's, the taps' and the engines' series meet."""

from __future__ import annotations

import json
import re

import yaml

from dsv4_operator import series
from tests.support.series import operator_families, tap_families

from .support import DASHBOARD_FILE, RULES_FILE, metric_names

SCOPED = {
    name: labels
    for name, labels in {**operator_families(), **tap_families()}.items()
    if labels[: len(series.SCOPE)] == series.SCOPE
}
# by (...), on (...), ignoring (...), without (...): the label lists of an expression.
CLAUSE = re.compile(r"\b(by|on|without|ignoring)\s*\(([^)]*)\)")


def _scoped(expr: str) -> bool:
    """The expression reads some family about one deployment (a histogram's by its parts)."""
    return any(re.sub(r"_(bucket|sum|count)$", "", m) in SCOPED for m in metric_names(expr))


def _clauses(expr: str) -> list[tuple[str, set[str]]]:
    return [
        (kind, {n.strip() for n in names.split(",") if n.strip()})
        for kind, names in CLAUSE.findall(expr)
    ]


def _alerts() -> list[dict[str, str]]:
    rules = yaml.safe_load(RULES_FILE.read_text())
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def test_every_rule_over_a_deployment_groups_and_joins_on_the_scope() -> None:
    checked = 0
    for rule in _alerts():
        if not _scoped(rule["expr"]):
            continue
        checked += 1
        for kind, names in _clauses(rule["expr"]):
            assert kind in ("by", "on"), (rule["alert"], kind)
            assert set(series.SCOPE) <= names, (rule["alert"], kind, names)
    assert checked >= 9  # the guard's alerts


def test_the_sglang_rules_group_by_the_scope_too() -> None:
    """The engines' series carry `deployment` from the ServiceMonitor's relabelling."""
    for rule in _alerts():
        if "sglang:" in rule["expr"]:
            for kind, names in _clauses(rule["expr"]):
                if kind != "without":
                    assert set(series.SCOPE) <= names, (rule["alert"], names)


def _targets() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    return [
        (p["title"], t["expr"])
        for p in dashboard["panels"]
        if p["type"] != "row"
        for t in p["targets"]
    ]


def test_every_dashboard_query_over_a_deployment_selects_and_groups_on_the_scope() -> None:
    for title, expr in _targets():
        if not (_scoped(expr) or "sglang:" in expr):
            continue
        for label in series.SCOPE:
            assert f'{label}=~"${label}"' in expr.replace(" ", ""), (title, label)
        for kind, names in _clauses(expr):
            if kind in ("by", "on") and names - {"le", "job", "mode", "verdict"}:
                assert set(series.SCOPE) <= names, (title, names)


def test_the_dashboard_variables_are_the_scope() -> None:
    variables = {v["name"]: v for v in json.loads(DASHBOARD_FILE.read_text())["templating"]["list"]}
    assert variables["namespace"]["definition"] == "label_values(dsv4_revision_info, namespace)"
    assert variables["deployment"]["definition"] == (
        'label_values(dsv4_revision_info{namespace=~"$namespace"}, deployment)'
    )


def test_the_rules_file_header_states_the_vocabulary() -> None:
    header = RULES_FILE.read_text().split("groups:")[0]
    for label, meaning in series.MEANING.items():
        assert f"# - {label}: " in header, label
        assert meaning.replace("`", "").split()[0] in header

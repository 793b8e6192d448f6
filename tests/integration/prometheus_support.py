"""The real-Prometheus tier's setup: the scrape jobs the ServiceMonitors would give, the alert
rules with their durations scaled, and the dashboard's queries as Grafana would send them.

Scaled durations: the product's rules wait minutes (`for: 5m`, `[10m]` windows, `offset 15m`,
an age `time() - ... > 900` in seconds); the harness loads a copy in which every duration is
divided by `SCALE` (1m -> 2s), so an alert fires and resolves within a test. Thresholds and
the expressions' shape are untouched; the product's rules file is never edited.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from dsv4_devcluster.prometheus import PodTarget, scale_rules, scrape_job
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.children import render_spec

from ..chart.support import DASHBOARD_FILE, RULES_FILE, render

SCALE = 30
OPERATOR_NAMESPACE = "dsv4-system"


def scaled_rules(path: Path) -> Path:
    """A copy of the chart's rules file with every `for:` and every range or offset divided by
    SCALE, written to `path`."""
    return scale_rules(RULES_FILE, path, SCALE)


def alert_names() -> list[str]:
    rules = yaml.safe_load(RULES_FILE.read_text())
    return [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]


def operator_job(metrics_port: int) -> dict[str, Any]:
    """The operator scraped through the chart's own ServiceMonitor (job dsv4-operator), from a
    pod in the release's namespace, not the DSV4Deployment's."""
    [monitor] = [
        o
        for o in render({"metrics": {"serviceMonitor": {"enabled": True}}})
        if o["kind"] == "ServiceMonitor"
    ]
    [endpoint] = monitor["spec"]["endpoints"]
    target = PodTarget(
        f"127.0.0.1:{metrics_port}", OPERATOR_NAMESPACE, "dsv4-operator-0", "dsv4-operator"
    )
    return scrape_job("dsv4-operator", endpoint, [target])


def deployment_jobs(
    spec: dict[str, Any], namespace: str, name: str, engine: str, tap: str
) -> list[dict[str, Any]]:
    """The engines' and the tap's scrape through the ServiceMonitor the operator renders for
    `spec`: the decode engine double at `engine`, the tap's /metrics at `tap` (host:port).
    The router itself is not run here (its `metrics` endpoint has no target)."""
    objs = render_spec(name, namespace, DSV4DeploymentSpec.model_validate(spec), None)
    [monitor] = [o for o in objs if o["kind"] == "ServiceMonitor"]
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    pods = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("StatefulSet", "Deployment")}
    decode, router = pods[f"{name}-decode"], pods[f"{name}-router"]

    def target(obj: dict[str, Any], address: str) -> PodTarget:
        labels = obj["spec"]["template"]["metadata"]["labels"]
        return PodTarget(address, namespace, f"{obj['metadata']['name']}-0",
                         obj["metadata"]["name"], labels)  # fmt: skip

    return [
        scrape_job(f"{name}-decode", endpoints["http"], [target(decode, engine)]),
        scrape_job(f"{name}-router", endpoints["tap-metrics"], [target(router, tap)]),
    ]


# What Grafana puts in place of its built-in variables, at a 1s scrape interval: the rate
# interval is four scrapes at least (Grafana's rule), 15s leaves room for a late one.
GRAFANA_BUILTINS = {"$__rate_interval": "15s", "$__interval": "1s", "$__range": "1m"}


def dashboard_queries(variables: dict[str, str]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every dashboard target with its variables substituted as
    Grafana does for one selected value each: our values hold no regex metacharacter, so
    Grafana's escaping leaves them as they are."""
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_BUILTINS.items():
                expr = expr.replace(name, value)
            for name, value in variables.items():
                expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
            queries.append((panel["title"], expr))
    return queries


def variable_queries() -> dict[str, str]:
    """name -> the PromQL selector of each `label_values(selector, label)` variable."""
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    out = {}
    for variable in dashboard["templating"]["list"]:
        match = re.match(r"label_values\((.*),\s*(\w+)\)$", variable.get("definition", ""))
        if match:
            out[variable["name"]] = match[1]
    return out

"""The real-Prometheus tier's setup: the scrape jobs the ServiceMonitors would give, the alert
rules with their durations scaled, and the dashboard's queries as Grafana would send them.

Scaled durations: the product's rules wait minutes (`for: 5m`, `[10m]` windows, `offset 15m`,
an age `time() - ... > 900` in seconds); the harness loads a copy in which every window, offset
and age is divided by `SCALE` (1m -> 2s) and every `for:` by `FOR_SCALE` (1m -> 1s), so an
alert fires and resolves within a test. A window keeps the room it needs for its thresholds'
counts (200 responses, 100 requests) under the tests' traffic on a loaded machine; a `for:`
only holds a condition, and holding it half as long proves the same. Thresholds and the
expressions' shape are untouched; the product's rules file is never edited.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes.dynamic.exceptions import NotFoundError

from dsv4_devcluster import wait_for
from dsv4_devcluster.deployments import Cluster, baked_revision
from dsv4_devcluster.operator import OperatorProcess
from dsv4_devcluster.prometheus import PodTarget, PrometheusProcess, scale_rules, scrape_job
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.children import render_spec

from ..chart.support import DASHBOARD_FILE, RULES_FILE, render
from .guard_support import EngineKubelet, tap_process

SCALE = 30
FOR_SCALE = 60
OPERATOR_NAMESPACE = "dsv4-system"


def scaled_rules(path: Path) -> Path:
    """A copy of the chart's rules file with every range, offset and age divided by SCALE and
    every `for:` by FOR_SCALE, written to `path`."""
    return scale_rules(RULES_FILE, path, SCALE, FOR_SCALE)


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


class Stack:
    """One deployment served to one Prometheus, shared by the tests of a module on one worker
    (each part costs seconds to start, the deployment a bake): the operator, the engine double
    behind its kubelet, a `dsv4 tap` in front of it, and the deployment applied as `healthy`.

    Between tests it is healthy: every part running, `healthy` applied and baked, the double
    serving it, no alert pending or firing. A test may stop a part or change the spec (and says
    so); `restore` brings it back after each test, `check_healthy` proves it before the next, so
    a test that leaves it otherwise fails the next test's setup with what is off, not its body.
    """

    def __init__(
        self,
        cluster: Cluster,
        operator: OperatorProcess,
        ports: dict[str, int],
        healthy: dict[str, Any],
        log_dir: Path,
    ) -> None:
        self.cluster, self.operator, self.ports, self.healthy = cluster, operator, ports, healthy
        self.log_dir = log_dir
        self.name: str = healthy["metadata"]["name"]
        self.engine = EngineKubelet(cluster, ports["engine"], log_dir, self.name).start()
        self._tap = contextlib.ExitStack()
        self.tap: subprocess.Popen[bytes] | None = None
        self.start_tap(log_dir)
        self.prom: PrometheusProcess | None = None
        self._baseline: tuple[dict[str, Any], dict[str, str]] | None = None  # spec, engine env

    def start_tap(self, log_dir: Path) -> subprocess.Popen[bytes]:
        """The tap again (after `stop_tap`), logging under `log_dir`."""
        upstream = f"http://127.0.0.1:{self.ports['engine']}"
        namespace = self.cluster.namespace
        self.tap = self._tap.enter_context(
            tap_process(upstream, self.ports, log_dir, namespace, self.name)
        )
        return self.tap

    def stop_tap(self) -> None:
        self._tap.close()
        self.tap = None

    def start_engine(self, log_dir: Path) -> EngineKubelet:
        """The engine double's kubelet again (after `engine.stop()`), logging under `log_dir`."""
        self.engine = EngineKubelet(self.cluster, self.ports["engine"], log_dir, self.name)
        return self.engine.start()

    def close(self) -> None:
        self.stop_tap()
        self.engine.stop()
        self.operator.stop()

    def restore(self, log_dir: Path) -> None:
        """Every stopped part started again, `healthy` applied (made again if deleted) and
        baked, and every alert resolved."""
        if self.operator.proc is None or self.operator.proc.poll() is not None:
            self.operator.start()
        if not self.engine.serving:
            self.engine.stop()
            self.start_engine(log_dir)
        if self.tap is None or self.tap.poll() is not None:
            self.stop_tap()
            self.start_tap(log_dir)
        started = time.monotonic()
        self.cluster.apply(self.healthy)
        wait_for("the healthy configuration baked and served", self._healthy_served, 240)
        if self._baseline is None:
            self._baseline = self.cluster.get(self.name)["spec"], self.engine.env
        baked = time.monotonic()
        active = _active(self.prom) if self.prom is not None else []
        if self.prom is not None:
            prom = self.prom
            wait_for("every alert resolved", lambda: not _active(prom), timeout=240)
        resolved = time.monotonic() - baked
        print(
            f"stack restored: baked in {baked - started:.1f}s, then {resolved:.1f}s until every "
            f"alert resolved (active then: {active})"
        )

    def check_healthy(self) -> None:
        """Fails naming what is off when the stack is not as `restore` leaves it."""
        problems = []
        if self.operator.proc is None or self.operator.proc.poll() is not None:
            problems.append("the operator is not running")
        if not self.engine.serving:
            problems.append("the engine double is not running")
        if self.tap is None or self.tap.poll() is not None:
            problems.append("the tap is not running")
        try:
            self.cluster.get(self.name)
        except NotFoundError:
            problems.append(f"DSV4Deployment {self.name} is gone")
        else:
            if not self._healthy_served():
                problems.append(
                    f"{self.name} is not the healthy configuration baked and served "
                    f"(status {self.cluster.get(self.name).get('status', {})}, "
                    f"engine env {self.engine.env})"
                )
        if self.prom is not None and (active := _active(self.prom)):
            # The guard's own account, so a window that went NoData after a bake says why.
            guard = self._guard_status()
            problems.append(f"alerts still active: {active} (status.guard: {guard})")
        assert not problems, (
            "the shared stack is not healthy at the start of this test (the test before it on "
            "this worker left it so, or restoring it failed): " + "; ".join(problems)
        )

    def _guard_status(self) -> dict[str, Any]:
        """status.guard's verdict, reason, message and counts ({} when the object is gone)."""
        try:
            guard = self.cluster.get(self.name).get("status", {}).get("guard") or {}
        except NotFoundError:
            return {}
        fields = (
            "revision",
            "lastVerdict",
            "lastReason",
            "lastMessage",
            "samples",
            "leaks",
            "trafficSamples",
        )
        return {k: guard[k] for k in fields if k in guard}

    def _healthy_served(self) -> bool:
        """`healthy` baked (`baked_revision`: observed, rolled out and its revision the last
        known good one) and the double runs it; once recorded, the spec and the double's env
        are the first bake's. (Without the rollout, right after `healthy` was applied over a
        baked change, the engine double's restart made the next test's canary windows end
        NoData.)"""
        try:
            obj = self.cluster.get(self.name)
        except NotFoundError:
            return False
        baked = baked_revision(obj) is not None and self.engine.serving
        if not baked or self._baseline is None:
            return baked
        spec, env = self._baseline
        return bool(obj["spec"] == spec and self.engine.env == env)


def _active(prom: PrometheusProcess) -> list[tuple[str, str]]:
    """(alert, state) of every alert pending or firing."""
    return [(a["labels"]["alertname"], a["state"]) for a in prom.alerts()]

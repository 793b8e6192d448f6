"""One label vocabulary (series.py) on every exporter: the operator's families, the leak tap's,
the tap's arguments as rendered, and the relabelling of the engines' scrape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dsv4_operator import cli, series
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.names import DEPLOYMENT_LABEL, ROLE_LABEL
from dsv4_operator.render.children import render_spec
from dsv4_operator.tap.metrics import TapMetrics
from dsv4_operator.tap.worker import ClassifierLink
from tests.support.series import operator_families, tap_families

# Families about the operator process itself, not about one deployment.
PROCESS_FAMILIES = {
    "dsv4_reconciles_total",
    "dsv4_reconcile_duration_seconds",
    "dsv4_api_writes_total",
    "dsv4_api_reads_total",
    "dsv4_watch_lists_total",
    "dsv4_watch_errors_total",
    "dsv4_leader",
    "dsv4_events_total",
    "dsv4_canary_slot_wait_seconds",  # the operator-wide bound, DSV4_GUARD_CANARIES_AT_ONCE
    "dsv4_guard_read_slot_wait_seconds",  # the operator-wide bound, DSV4_GUARD_READS_AT_ONCE
    "dsv4_guard_read_seconds",  # how long a read holds one of those slots
}


@pytest.mark.parametrize(
    ("name", "labels"), sorted({**operator_families(), **tap_families()}.items())
)
def test_every_family_about_a_deployment_leads_with_namespace_and_bare_name(
    name: str, labels: tuple[str, ...]
) -> None:
    if name in PROCESS_FAMILIES:
        assert not set(labels) & set(series.SCOPE), name
    else:
        assert labels[: len(series.SCOPE)] == series.SCOPE, name


def test_the_tap_labels_its_series_with_the_values_it_is_given() -> None:
    registry = TapMetrics(ClassifierLink(), ("prod", "flash")).registry
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert sample.labels["namespace"] == "prod", sample
            assert sample.labels["deployment"] == "flash", sample


def _render(
    variant: Callable[..., dict[str, Any]], changes: dict[str, Any]
) -> list[dict[str, Any]]:
    spec = DSV4DeploymentSpec.model_validate(variant(changes))
    return render_spec("flash", "prod", spec, None)


def test_the_rendered_tap_is_told_its_namespace_and_bare_name(
    variant: Callable[..., dict[str, Any]],
) -> None:
    router = next(o for o in _render(variant, {}) if o["kind"] == "Deployment")
    [tap] = [c for c in router["spec"]["template"]["spec"]["containers"] if c["name"] == "tap"]
    args = tap["args"]
    assert args[args.index("--deployment") + 1] == "flash"
    assert args[args.index("--namespace") + 1] == "prod"


def test_the_service_monitor_gives_the_engines_the_labels_and_keeps_the_taps(
    variant: Callable[..., dict[str, Any]],
) -> None:
    objs = _render(variant, {"monitoring.serviceMonitor": {"enabled": True}})
    monitor = next(o for o in objs if o["kind"] == "ServiceMonitor")
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    assert set(endpoints) == {"http", "metrics", "tap-metrics"}
    for port in ("http", "metrics"):
        relabel = {r["targetLabel"]: r for r in endpoints[port]["relabelings"]}
        # Prometheus's Kubernetes discovery: a pod label's name with every character outside
        # [a-zA-Z0-9_] turned into `_`.
        assert relabel["deployment"]["sourceLabels"] == [
            "__meta_kubernetes_pod_label_dsv4_io_deployment"
        ]
        assert relabel["role"]["sourceLabels"] == ["__meta_kubernetes_pod_label_dsv4_io_role"]
        assert not endpoints[port].get("honorLabels")
    assert DEPLOYMENT_LABEL == "dsv4.io/deployment" and ROLE_LABEL == "dsv4.io/role"
    # The tap exports `namespace` itself: honoured, not renamed to exported_namespace.
    assert endpoints["tap-metrics"]["honorLabels"] is True
    assert "relabelings" not in endpoints["tap-metrics"]


@pytest.mark.parametrize(
    ("deployment", "namespace", "expected"),
    [
        ("flash", None, ("flash", "default")),
        ("flash", "prod", ("flash", "prod")),
        ("prod/flash", None, ("flash", "prod")),  # the old `namespace/name` spelling
        ("prod/flash", "prod", ("flash", "prod")),
    ],
)
def test_tap_flags_stay_backwards_compatible(
    deployment: str, namespace: str | None, expected: tuple[str, str]
) -> None:
    assert cli._tap_scope(deployment, namespace) == expected


@pytest.mark.parametrize(
    ("deployment", "namespace"), [("prod/flash", "staging"), ("/flash", None), ("prod/", None)]
)
def test_tap_refuses_a_deployment_that_contradicts_its_namespace(
    deployment: str, namespace: str | None
) -> None:
    args = ["tap", "--upstream", "http://127.0.0.1:9", "--deployment", deployment]
    result = CliRunner().invoke(
        cli.main, [*args, *(["--namespace", namespace] if namespace else [])]
    )
    assert result.exit_code == 2
    assert "--deployment" in result.output and "namespace/name" in result.output

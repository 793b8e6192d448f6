"""Day 2 with the chart, rendered by the real `helm`: one `helm test` entry per check, a test pod
that cleans up after itself, NOTES true for the values used, a clear failure when the
prometheus-operator kinds are missing, and no relative runbook links."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from .support import CHART, RULES_FILE, by_kind, helm_args, render, run, tool

# What `helm install` sees on any real cluster (every kube-apiserver serves it) and an offline
# `helm template` does not: with it, the chart knows it looked at the cluster's APIs.
DISCOVERED = ["--api-versions", "apiregistration.k8s.io/v1"]


def notes(values: dict[str, Any]) -> str:
    """NOTES.txt as `helm install` prints it for `values` (a client-side dry run, no cluster)."""
    proc = run(
        [
            tool("helm"),
            "install",
            "dsv4-operator",
            CHART,
            "--namespace",
            "dsv4-system",
            "--dry-run=client",
            *helm_args(values),
        ]
    )
    return proc.stdout.split("NOTES:\n", 1)[1]


def _hooks(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if (o["metadata"].get("annotations") or {}).get("helm.sh/hook")]


def test_helm_test_has_one_entry_its_pod_which_a_pass_deletes() -> None:
    """`helm test` lists every test hook; the selftest is one check, so one hook: its
    ServiceAccount and Roles are release objects that `helm uninstall` removes."""
    objects = render(tests=True)
    (pod,) = _hooks(objects)
    assert pod["kind"] == "Pod"
    policy = pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(",")
    assert set(policy) == {"before-hook-creation", "hook-succeeded"}
    account = pod["spec"]["serviceAccountName"]
    assert account in {o["metadata"]["name"] for o in by_kind(render(), "ServiceAccount")}
    test_rbac = [o for o in render() if o["metadata"]["name"].startswith(account)]
    assert {o["kind"] for o in test_rbac} == {"ServiceAccount", "Role", "RoleBinding"}
    off = render({"test": {"enabled": False}}, tests=True)
    assert not _hooks(off) and not [o for o in off if o["metadata"]["name"].startswith(account)]


def test_helm_test_leaves_out_the_webhook_check_when_the_webhook_is_off() -> None:
    def args(values: dict[str, Any]) -> list[str]:
        (pod,) = by_kind(render(values, tests=True), "Pod")
        container_args: list[str] = pod["spec"]["containers"][0]["args"]
        return container_args

    assert "--no-webhook" not in args({})
    assert "--no-webhook" in args({"webhook": {"enabled": False}})


def test_notes_advertise_only_what_the_values_install() -> None:
    default = notes({})
    assert "# the operator leads, the webhook admits and refuses" in default
    assert "Metrics: service dsv4-operator-metrics:8080/metrics" in default
    off = notes({"webhook": {"enabled": False}, "metrics": {"service": {"enabled": False}}})
    assert "Validating webhook: off" in off
    assert "the webhook admits" not in off
    assert "# the operator leads, the API server admits a sound spec (no webhook to check)" in off
    assert "Metrics: service" not in off and "Metrics: port 8080/metrics of each" in off
    assert "helm test" not in notes({"test": {"enabled": False}})


@pytest.mark.parametrize(
    ("values", "kind", "value"),
    [
        ({"prometheusRule": {"enabled": True}}, "PrometheusRule", "prometheusRule.enabled"),
        (
            {"metrics": {"serviceMonitor": {"enabled": True}}},
            "ServiceMonitor",
            "metrics.serviceMonitor.enabled",
        ),
    ],
)
def test_a_monitoring_kind_the_cluster_lacks_fails_saying_what_to_install(
    values: dict[str, Any], kind: str, value: str
) -> None:
    argv: list[str | Path] = [tool("helm"), "template", "x", CHART, *helm_args(values), *DISCOVERED]
    proc = run(argv, check=False)
    assert proc.returncode != 0
    message = " ".join(proc.stderr.split())
    assert f"{value}=true needs the {kind} kind of prometheus-operator" in message
    assert "install prometheus-operator and its CRDs first" in message
    assert f"or set {value}=false" in message
    served = render(
        values, extra=[*DISCOVERED, "--api-versions", f"monitoring.coreos.com/v1/{kind}"]
    )
    assert len(by_kind(served, kind)) == 1
    assert len(by_kind(render(values), kind)) == 1  # offline (helm template, lint): rendered


def test_the_plain_rules_file_has_no_relative_runbook_url() -> None:
    """`rule_files:` users get the file as is: a relative runbook_url resolves nowhere."""
    rules = [r for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]]
    urls = [(r.get("annotations") or {}).get("runbook_url") for r in rules if "alert" in r]
    relative = [u for u in urls if u is not None and not urlparse(u).scheme.startswith("http")]
    assert relative == []

"""The alert rules: promtool check and unit tests, one runbook section per alert, every alert
tested firing and not firing, and only metrics that exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .support import PROMTOOL_TESTS, RULES_FILE, RUNBOOK, known_metric, metric_names, run, tool

EXPECTED_ALERTS = {
    "DSV4LeakRateHigh",
    "DSV4RollbackPerformed",
    "DSV4ConfigQuarantined",
    "DSV4OOMEvents",
    "DSV4GuardBlind",
    "DSV4GuardNoData",
    "DSV4LeakTapUnreachable",
    "DSV4LeakTapDropping",
    "DSV4CanaryNotRunning",
    "DSV4OperatorDown",
    "DSV4ReconcileErrors",
    "DSV4GuardReadsQueued",
    "DSV4KVTransferFailures",
    "DSV4KVIntegrity",
    "DSV4KVBootstrapFailures",
    "DSV4KVPoolPressure",
    "DSV4EagerDecodeFallback",
}


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def test_promtool_check_rules_accepts_the_rules_file() -> None:
    proc = run([tool("promtool"), "check", "rules", RULES_FILE])
    assert f"SUCCESS: {len(_alerts())} rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = run([tool("promtool"), "test", "rules", PROMTOOL_TESTS])
    assert "SUCCESS" in proc.stdout


def test_the_rules_cover_the_issue_list() -> None:
    assert {a["alert"] for a in _alerts()} == EXPECTED_ALERTS
    exprs = " ".join(a["expr"] for a in _alerts())
    for metric in (
        "dsv4_leak_rate",
        "dsv4_rollbacks_total",
        "dsv4_quarantined_configs",
        "dsv4_oom_events_total",
        "dsv4_guard_blind",
        "dsv4_guard_taps_unreachable",
        "dsv4_canary_last_run_timestamp_seconds",
        "dsv4_guard_read_slot_wait_seconds_bucket",
        "sglang:num_transfer_failed_reqs_total",
        "sglang:num_requests_total",
        "sglang:num_bootstrap_failed_reqs_total",
        "sglang:token_usage",
        'sglang:cuda_graph_passes_total{mode="decode_none"}',
    ):
        assert metric in exprs, metric


def test_every_alert_has_severity_summary_description_and_a_runbook_section() -> None:
    headings = {
        _anchor(line[3:]) for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")
    }
    for alert in _alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in {"critical", "warning"}, name
        annotations = alert["annotations"]
        assert len(annotations["summary"]) > 10 and len(annotations["description"]) > 40, name
        # The anchor the chart's runbookBaseUrl links to; the plain file links nowhere.
        assert "runbook_url" not in annotations, name
        assert name.lower() in headings, f"docs/runbook.md has no section {name}"


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases = yaml.safe_load(PROMTOOL_TESTS.read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in cases["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"
    rules_path = (PROMTOOL_TESTS.parent / cases["rule_files"][0]).resolve()
    assert rules_path == RULES_FILE.resolve()


def test_every_alert_has_a_resolve_path() -> None:
    """Each alert fires and later, in the same test case, clears: an alert that cannot
    resolve (a series never removed, a window that never empties) pages for good."""
    cases = yaml.safe_load(PROMTOOL_TESTS.read_text())
    resolving: set[str] = set()
    for case in cases["tests"]:
        checks = case.get("alert_rule_test", [])
        for fired in (c for c in checks if c["exp_alerts"]):
            later = [
                c
                for c in checks
                if c["alertname"] == fired["alertname"]
                and not c["exp_alerts"]
                and _minutes(c["eval_time"]) > _minutes(fired["eval_time"])
            ]
            if later:
                resolving.add(fired["alertname"])
    assert {a["alert"] for a in _alerts()} - resolving == set(), "alerts never tested resolving"


def _minutes(duration: str) -> int:
    match = re.fullmatch(r"(\d+)m", duration)
    assert match, f"eval_time {duration!r}: write it in minutes"
    return int(match.group(1))


def test_rules_use_only_metrics_that_exist() -> None:
    for alert in _alerts():
        unknown = {m for m in metric_names(alert["expr"]) if not known_metric(m)}
        assert not unknown, f"{alert['alert']} uses unknown metrics {unknown}"


@pytest.mark.parametrize(
    ("alert", "before", "after"),
    [
        ("DSV4LeakRateHigh", "(dsv4_leak_rate) > 0.02", "(dsv4_leak_rate) > 0.2"),
        ("DSV4RollbackPerformed", "offset 15m) > 0)", "offset 15m) > 5)"),
        ("DSV4KVPoolPressure", "(sglang:token_usage) > 0.92", "(sglang:token_usage) > 0.99"),
        ("DSV4OperatorDown", 'absent(up{job="dsv4-operator"} == 1)', 'up{job="dsv4-op"} == 0'),
        # Only the resolve paths catch these: the alert still fires, but never clears.
        (
            "DSV4GuardBlind",
            "max by (namespace, deployment) (dsv4_guard_blind) > 0",
            "max by (namespace, deployment) (max_over_time(dsv4_guard_blind[1h])) > 0",
        ),
        (
            "DSV4LeakRateHigh",
            "max by (namespace, deployment, revision) (dsv4_leak_rate) > 0.02",
            "max by (namespace, deployment, revision) (last_over_time(dsv4_leak_rate[1h])) > 0.02",
        ),
        # Traffic of one deployment must not silence the canary of its namesake elsewhere.
        (
            "DSV4LeakRateHigh",
            "unless on (namespace, deployment)",
            "unless on (deployment)",
        ),
    ],
)
def test_unit_tests_catch_a_broken_rule(
    alert: str, before: str, after: str, tmp_path: Path
) -> None:
    """Mutate one rule: promtool's unit tests must fail on that alert."""
    text = RULES_FILE.read_text()
    assert before in text
    rules_dir = tmp_path / "charts" / "dsv4-operator" / "files"
    rules_dir.mkdir(parents=True)
    (rules_dir / RULES_FILE.name).write_text(text.replace(before, after, 1))
    tests_dir = tmp_path / "tests" / "chart" / "promtool"
    tests_dir.mkdir(parents=True)
    (tests_dir / PROMTOOL_TESTS.name).write_text(PROMTOOL_TESTS.read_text())
    proc = run([tool("promtool"), "test", "rules", tests_dir / PROMTOOL_TESTS.name], check=False)
    assert proc.returncode != 0
    assert f"alertname: {alert}" in proc.stdout + proc.stderr

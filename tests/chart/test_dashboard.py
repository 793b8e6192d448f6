"""The Grafana dashboard: its JSON model, that every PromQL expression parses (promtool), that
every metric it names exists, and that it shows what the issue asks for."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from .support import DASHBOARD_FILE, RULES_FILE, known_metric, metric_names, run, tool

# Values promtool can parse in place of Grafana's variables.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
}


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return data


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def _targets() -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in _panels() for t in p["targets"]]


def _variables() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in _dashboard()["templating"]["list"]}


def _substitute(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    # Query variables are used inside regex matchers; any regex-safe word parses.
    return re.sub(r"\$\{?(\w+)\}?", r"\1", expr)


def test_json_model_is_a_grafana_dashboard() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "dsv4-operator"
    assert dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert grid["h"] > 0 and grid["y"] >= 0, panel["title"]
    for panel in _panels():
        assert panel["type"] in {"timeseries", "stat", "table", "state-timeline"}, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"] == panel["datasource"]
    # Panels do not overlap (rows aside, each grid cell has one owner).
    cells: dict[tuple[int, int], str] = {}
    for panel in _panels():
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_variable_used_is_defined() -> None:
    variables = _variables()
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    used = {
        name
        for _, target in _targets()
        for name in re.findall(r"\$\{?(\w+)\}?", target["expr"])
        if not name.startswith("__")
    }
    assert used <= set(variables), used - set(variables)
    assert variables["role"]["query"] == "prefill,decode"
    rows = [p for p in _dashboard()["panels"] if p["type"] == "row"]
    assert any(r.get("repeat") == "role" for r in rows), "SGLang panels repeat per role"


def test_every_expression_parses(tmp_path: Path) -> None:
    """promtool parses each expression as a recording rule (the same parser as Prometheus)."""
    rules = [
        {"record": f"dashboard:expr_{i}", "expr": _substitute(target["expr"])}
        for i, (_, target) in enumerate(_targets())
    ]
    for variable in _variables().values():  # the query variables' label_values() metrics
        match = re.match(r"label_values\((.*),\s*\w+\)$", variable.get("definition", ""))
        if match:
            rules.append({"record": f"dashboard:var_{variable['name']}", "expr": match[1]})
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = run([tool("promtool"), "check", "rules", path])
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout


def test_a_broken_expression_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "broken.rules.yaml"
    rule = {"record": "x", "expr": "sum by (job (rate(sglang:token_usage[5m]))"}
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
    assert run([tool("promtool"), "check", "rules", path], check=False).returncode != 0


def test_every_metric_named_exists() -> None:
    for title, target in _targets():
        unknown = {m for m in metric_names(target["expr"]) if not known_metric(m)}
        assert not unknown, f"panel {title!r} uses unknown metrics {unknown}"
    for variable in _variables().values():
        definition = variable.get("definition", "")
        for name in re.findall(r"label_values\(([\w:]+)", definition):
            assert known_metric(name), variable["name"]


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    used = {m for _, t in _targets() for m in metric_names(t["expr"])}
    assert {
        # guard: leak rate, canary verdicts, rollbacks, quarantine, OOM
        "dsv4_leak_rate",
        "dsv4_canary_responses_total",
        "dsv4_rollbacks_total",
        "dsv4_quarantined_configs",
        "dsv4_oom_events_total",
        "dsv4_guard_outcome",
        "dsv4_guard_blind",
        "dsv4_revision_info",
        # the culprit search after a rollback (docs/bisect.md)
        "dsv4_bisect_probes_total",
        "dsv4_bisect_shadow_pairs",
        # per role: throughput, TTFT, inter-token latency, token usage, queue, retractions,
        # KV transfer latency and failures, CUDA graph vs eager passes
        "sglang:generation_tokens_total",
        "sglang:gen_throughput",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket",
        "sglang:token_usage",
        "sglang:num_queue_reqs",
        "sglang:num_retracted_requests_total",
        "sglang:kv_transfer_latency_ms",
        "sglang:num_transfer_failed_reqs_total",
        "sglang:num_bootstrap_failed_reqs_total",
        "sglang:cuda_graph_passes_total",
    } <= used
    leak = next(p for p in _panels() if any("dsv4_leak_rate" in t["expr"] for t in p["targets"]))
    # Production traffic (the leak taps) and the canary side by side, in one panel.
    canary = next(t for t in leak["targets"] if "dsv4_leak_rate" in t["expr"])
    assert "by (namespace, deployment, revision)" in canary["expr"]
    traffic = next(t for t in leak["targets"] if "dsv4_traffic_responses_total" in t["expr"])
    assert 'verdict!="error"' in traffic["expr"]
    steps = leak["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert {"color": "red", "value": 0.02} in steps, "leak-rate threshold line"
    assert leak["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"
    for panel in _panels():
        if any("sglang:" in t["expr"] for t in panel["targets"]):
            for target in panel["targets"]:
                assert "$role" in target["expr"], f"{panel['title']} is not per role"


def test_the_guards_slot_waits_are_shown_against_the_alerts_line() -> None:
    """DSV4GuardReadsQueued's figure (p90 of the read slot wait per operator pod, 1 s), how
    long a read then holds its slot, and the canary's slot wait, on one panel with the alert's
    threshold drawn."""
    rules = yaml.safe_load(RULES_FILE.read_text())
    alert = next(
        r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "DSV4GuardReadsQueued"
    )
    line = float(alert["expr"].rsplit(">", 1)[1])
    panel = next(p for p in _panels() if p["title"] == "Guard slots (p90)")
    exprs = [t["expr"] for t in panel["targets"]]
    assert any("dsv4_guard_read_slot_wait_seconds_bucket" in e for e in exprs), exprs
    assert any("dsv4_guard_read_seconds_bucket" in e for e in exprs), exprs
    assert any("dsv4_canary_slot_wait_seconds_bucket" in e for e in exprs), exprs
    assert all(e.startswith("histogram_quantile(0.9, sum by (pod, le)") for e in exprs), exprs
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert {"color": "red", "value": line} in steps, (line, steps)
    assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"

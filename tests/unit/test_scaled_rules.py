"""The test copy of the alert rules: windows, offsets and ages divided by one scale, the `for:`
holds by their own, thresholds and the expressions' shape as the chart has them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from dsv4_devcluster.prometheus import scale_rules
from tests.support.paths import REPO

RULES = REPO / "charts" / "dsv4-operator" / "files" / "dsv4.rules.yaml"


def _alerts(path: Path) -> dict[str, dict[str, Any]]:
    rules = yaml.safe_load(path.read_text())
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def test_for_holds_scale_apart_from_the_windows(tmp_path: Path) -> None:
    scaled = _alerts(scale_rules(RULES, tmp_path / "rules.yaml", 30, for_scale=60))
    chart = _alerts(RULES)
    assert scaled["DSV4GuardNoData"]["for"] == "30s"  # 30m / 60
    assert scaled["DSV4KVTransferFailures"]["for"] == "1s"  # 1m / 60
    assert "[20s]" in scaled["DSV4KVTransferFailures"]["expr"]  # [10m] / 30
    assert "offset 30s" in scaled["DSV4RollbackPerformed"]["expr"]  # offset 15m / 30
    assert "> 30" in scaled["DSV4CanaryNotRunning"]["expr"]  # an age of 900 s / 30
    for name, rule in chart.items():
        shape = re.sub(r"\[\w+\]|offset \w+|> \d+$", "", rule["expr"])
        assert shape == re.sub(r"\[\w+\]|offset \w+|> \d+$", "", scaled[name]["expr"]), name


def test_without_for_scale_the_holds_take_the_windows_scale(tmp_path: Path) -> None:
    scaled = _alerts(scale_rules(RULES, tmp_path / "rules.yaml", 30))
    assert scaled["DSV4GuardNoData"]["for"] == "60s"
    assert scaled["DSV4KVTransferFailures"]["for"] == "2s"

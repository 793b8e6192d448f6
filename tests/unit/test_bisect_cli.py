"""`dsv4 bisect` without --url-for: the units and the probe plan, and bad input named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from dsv4_operator.bisect import search
from dsv4_operator.bisect.outcome import Outcome, ProbeJudge, judge
from dsv4_operator.cli import main
from dsv4_operator.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from tests.support.builders import Doc, example_doc, with_changes
from tests.support.contract import assert_contract


def write(tmp_path: Path, name: str, doc: Doc) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def pair(tmp_path: Path) -> tuple[str, str]:
    good = example_doc()
    bad = dict(good)
    bad["spec"] = with_changes(
        good["spec"],
        {
            "engine.indexKDtype": "bf16",
            "engine.overlap.multiStream": True,
            "engine.extraArgs": ["--chunked-prefill-size", "4096"],
            "safety.acknowledge": ["DSV4-R002"],
        },
    )
    return write(tmp_path, "good.yaml", good), write(tmp_path, "bad.yaml", bad)


def test_dry_run_prints_the_units_and_the_probe_plan(tmp_path: Path) -> None:
    good, bad = pair(tmp_path)
    result = CliRunner().invoke(main, ["bisect", "--good", good, "--bad", bad, "--parallel", "2"])
    assert result.exit_code == EXIT_OK, result.output
    out = result.output
    assert "units (3):" in out
    assert "spec.engine.indexKDtype: fp8 -> bf16" in out
    assert "--chunked-prefill-size: (unset) -> 4096" in out
    assert "p1 reproduce" in out and "p2 control    none (the good spec)" in out
    assert "if p1 fails and p2 passes:" in out
    assert "p3 subset" in out and "p4 subset" in out
    assert "worst case 12 probes" in out
    result = CliRunner().invoke(main, ["bisect", "--good", good, "--bad", bad, "--no-control"])
    assert "control" not in result.output and "p2 subset" in result.output
    assert "worst case 11 probes" in result.output


def test_dry_run_json_has_the_units_and_first_probes(tmp_path: Path) -> None:
    good, bad = pair(tmp_path)
    result = CliRunner().invoke(main, ["bisect", "--good", good, "--bad", bad, "-o", "json"])
    assert result.exit_code == EXIT_OK
    payload = json.loads(result.stdout)
    assert_contract("bisect", payload)
    assert payload["search"] is None and payload["answer"] is None
    assert [u["id"] for u in payload["units"]] == [
        "engine.indexKDtype",
        "engine.overlap.multiStream",
        "engine.extraArgs:--chunked-prefill-size",
    ]
    assert [p["purpose"] for p in payload["firstProbes"]][:2] == ["reproduce", "control"]
    assert payload["worstCaseProbes"] == 12


def test_identical_specs_have_no_units(tmp_path: Path) -> None:
    good = write(tmp_path, "good.yaml", example_doc())
    result = CliRunner().invoke(main, ["bisect", "--good", good, "--bad", good])
    assert result.exit_code == EXIT_OK
    assert "units: none" in result.output


def test_a_file_without_a_deployment_or_with_a_bad_spec_is_named(tmp_path: Path) -> None:
    good = write(tmp_path, "good.yaml", example_doc())
    other = write(tmp_path, "cm.yaml", {"apiVersion": "v1", "kind": "ConfigMap"})
    result = CliRunner().invoke(main, ["bisect", "--good", good, "--bad", other])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "--bad" in result.output and "DSV4Deployment" in result.output
    broken = example_doc()
    broken["spec"]["engine"]["indexKDtype"] = "int3"
    bad = write(tmp_path, "bad.yaml", broken)
    result = CliRunner().invoke(main, ["bisect", "--good", good, "--bad", bad])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "spec.engine.indexKDtype" in result.output


def test_the_search_state_keeps_the_json_contract() -> None:
    """What `-o json` prints after a search (its `search` and `answer`) matches the schema:
    a search with every kind of probe, the control's included."""
    state = search.start(["a", "b", "c"], budget=30, control=True)
    _, evidence = judge(9, 40, ProbeJudge(threshold=0.02, alpha=0.01))
    while search.answer(state) is None:
        state, probes = search.next_probes(
            state, 2, lambda units: "DSV4-R001" if units == ["a"] else None
        )
        for probe in probes:
            failed = "b" in probe.units and "c" in probe.units
            outcome = Outcome.FAIL if failed else Outcome.PASS
            state = search.record(state, probe.probe_id, outcome, evidence)
    payload: dict[str, Any] = {
        "units": [],
        "firstProbes": [],
        "worstCaseProbes": 0,
        "search": state.model_dump(mode="json"),
        "answer": state.answer.model_dump(mode="json") if state.answer else None,
    }
    assert_contract("bisect", payload)
    assert {p["purpose"] for p in payload["search"]["probes"]} >= {"reproduce", "control"}

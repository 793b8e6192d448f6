"""The `dsv4` CLI contract: exit codes, JSON shapes, deterministic output."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from dsv4_operator.cli import main
from dsv4_operator.exit_codes import EXIT_CODES, USAGE_ERROR
from tests.support.contract import assert_contract
from tests.support.paths import EXAMPLE, REPO

UNSAFE = sorted((REPO / "examples" / "unsafe").glob("*.yaml"))


def run(*args: str, stdin: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.output


def run_json(*args: str, stdin: str | None = None) -> tuple[int, Any]:
    """A command with `-o json`: its exit code and its stdout parsed, checked against the
    command's schema."""
    result = CliRunner().invoke(main, [*args, "-o", "json"], input=stdin)
    payload = json.loads(result.stdout)
    assert_contract(args[0], payload)
    return result.exit_code, payload


def all_findings(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for d in payload["documents"] for f in d["findings"]]


def test_example_is_valid() -> None:
    code, payload = run_json("validate", "-f", str(EXAMPLE))
    assert code == 0
    assert payload == {
        "valid": True,
        "documents": [
            {
                "index": 1,
                "name": "dsv4-flash",
                "namespace": "default",
                "valid": True,
                "findings": [],
            }
        ],
    }


def test_there_is_an_unsafe_example_per_error_rule() -> None:
    from dsv4_operator.engine.rules import CATALOGUE

    covered = {"DSV4-" + p.name.split("-")[0].upper() for p in UNSAFE}
    errors = {r.id for r in CATALOGUE if r.severity == "error"}
    assert errors <= covered, f"no examples/unsafe file for {sorted(errors - covered)}"


@pytest.mark.parametrize("path", UNSAFE, ids=lambda p: p.name)
def test_unsafe_examples_fail_naming_their_rule(path: Path) -> None:
    rule = "DSV4-" + path.name.split("-")[0].upper()
    code, payload = run_json("validate", "-f", str(path))
    assert code == 1
    assert payload["valid"] is False
    assert rule in {f["rule"] for f in all_findings(payload) if f["severity"] == "error"}
    text_code, text = run("validate", "-f", str(path))
    assert text_code == 1 and rule in text


def test_schema_errors_exit_1_with_field_path(tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["engine"]["indexKDtype"] = "int8"
    doc["spec"]["engine"]["unknownKnob"] = True
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, payload = run_json("validate", "-f", str(path))
    assert code == 1
    findings = all_findings(payload)
    assert {(f["rule"], f["field"]) for f in findings} == {
        ("schema", "spec.engine.indexKDtype"),
        ("schema", "spec.engine.unknownKnob"),
    }
    assert all(set(f) == {"rule", "severity", "field", "message"} for f in findings)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("a: [unclosed", "not valid YAML"),
        ("apiVersion: v1\nkind: ConfigMap\n", "not a DSV4Deployment"),
        ("- just\n- a list\n", "not a DSV4Deployment"),
        ("", "no YAML document"),
    ],
)
def test_bad_input_exits_2(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(content)
    code, out = run("validate", "-f", str(path))
    assert code == 2 and reason in out


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9)
)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (BOMB, "more than 64 YAML aliases"),
        ("a: " + "[" * 200 + "]" * 200 + "\n", "nested deeper than 64 levels"),
        ("a: " + "{b: " * 100 + "1" + "}" * 100 + "\n", "nested deeper than 64 levels"),
        ("# " + "x" * (3 * 1024 * 1024) + "\n", "at most 3145728"),
    ],
    ids=["alias-bomb", "deep-list", "deep-map", "too-large"],
)
def test_hostile_yaml_is_refused_with_a_reason(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(content)
    for command in ("validate", "plan", "render"):
        result = CliRunner().invoke(main, [command, "-f", str(path)])
        assert result.exit_code == 2, (command, result.output)
        assert reason in result.output and "Traceback" not in result.output


def _example_with(old: str, new: str) -> str:
    text = EXAMPLE.read_text()
    assert old in text
    return text.replace(old, new, 1)


# Inputs an offline fuzz found crashing the CLI (a traceback, exit 1): PyYAML's reader refusing
# a character while the loader was built, and CPython refusing a decimal integer of more than
# 4,300 digits (a hex one parses, and would crash the first message that prints it).
CRASHERS = {
    "nul-byte": ("x: 1\x00\n", "U+0000 at line 1, column 5"),
    "bel-in-name": (_example_with("name: dsv4-flash", "name: dsv4\x07flash"), "U+0007 at line 7"),
    "escape-char": (_example_with("name: dsv4-flash", "name: dsv4\x1bflash"), "U+001B"),
    "huge-decimal": (
        _example_with("replicas: 1", "replicas: " + "9" * 5000),
        "more than 4300 digits",
    ),
    "huge-hex": (_example_with("replicas: 1", "replicas: 0x" + "f" * 4000), "more than 4300"),
}


@pytest.mark.parametrize(("content", "reason"), CRASHERS.values(), ids=CRASHERS)
@pytest.mark.parametrize("command", ["validate", "plan", "render"])
def test_control_characters_and_huge_integers_exit_2_with_a_reason(
    command: str, content: str, reason: str
) -> None:
    result = CliRunner().invoke(main, [command, "-f", "-"], input=content)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 2, result.output
    assert reason in result.stderr and "Traceback" not in result.output
    if command == "render":
        return  # its output is YAML manifests: nothing on stdout when nothing rendered
    assert result.stdout == ""
    code, payload = run_json(command, "-f", "-", stdin=content)  # checks the schema
    assert code == 2 and reason in payload["error"]["message"]


def test_escaped_control_characters_are_schema_findings_not_crashes() -> None:
    # Inside double quotes YAML may carry any character, escaped: the name check refuses it.
    content = _example_with("name: dsv4-flash", 'name: "dsv4\\aflash\\0"')
    code, payload = run_json("validate", "-f", "-", stdin=content)
    assert code == 1
    assert payload["documents"][0]["name"] == "dsv4\aflash\0"
    assert [f["field"] for f in all_findings(payload)] == ["metadata.name"]


def test_unreadable_file_exits_2_with_json_when_asked(tmp_path: Path) -> None:
    code, payload = run_json("plan", "-f", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read" in payload["error"]["message"]


def test_unreadable_file_exits_2(tmp_path: Path) -> None:
    code, out = run("validate", "-f", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read" in out


def test_multi_document_worst_exit_code(tmp_path: Path) -> None:
    unsafe = (REPO / "examples" / "unsafe" / "r001-bf16-hicache-no-gate.yaml").read_text()
    path = tmp_path / "both.yaml"
    path.write_text(EXAMPLE.read_text() + "\n---\n" + unsafe)
    code, payload = run_json("validate", "-f", str(path))
    assert code == 1
    assert [d["valid"] for d in payload["documents"]] == [True, False]
    path.write_text(EXAMPLE.read_text() + "\n---\napiVersion: v1\nkind: Pod\n")
    assert run("validate", "-f", str(path))[0] == 2


def test_a_foreign_document_does_not_hide_the_others_findings(tmp_path: Path) -> None:
    unsafe = (REPO / "examples" / "unsafe" / "r001-bf16-hicache-no-gate.yaml").read_text()
    path = tmp_path / "mixed.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\n---\n" + unsafe)
    code, payload = run_json("validate", "-f", str(path))
    assert code == 2  # the worst document decides
    foreign, deployment = payload["documents"]
    assert (foreign["index"], foreign["name"], foreign["valid"]) == (1, "cm", False)
    assert [(f["rule"], f["field"]) for f in foreign["findings"]] == [("input", "kind")]
    assert "not a DSV4Deployment" in foreign["findings"][0]["message"]
    assert "DSV4-R001" in {f["rule"] for f in deployment["findings"]}
    text_code, text = run("validate", "-f", str(path))
    assert text_code == 2 and "not a DSV4Deployment" in text and "DSV4-R001" in text


def test_plan_json_contract() -> None:
    code, payload = run_json("plan", "-f", str(EXAMPLE))
    assert code == 0
    [document] = payload["documents"]
    assert document["findings"] == []
    roles = document["plan"]["roles"]
    for role in ("prefill", "decode"):
        for key in (
            "bytesPerFullToken",
            "indexerBytesPerToken",
            "maxTotalTokens",
            "sessionsCapacity",
            "headroomGiB",
            "unpatchedOvercommitBytes",
        ):
            assert key in roles[role], key
    assert roles["decode"]["bytesPerFullToken"] == pytest.approx(7705.45)


def test_plan_table_and_invalid_plan() -> None:
    code, out = run("plan", "-f", str(EXAMPLE))
    assert code == 0 and "bytes per full token" in out and "7705.45" in out
    bad = REPO / "examples" / "unsafe" / "r008-plan-does-not-fit.yaml"
    code, payload = run_json("plan", "-f", str(bad))
    assert code == 1 and payload["documents"][0]["plan"]["roles"]["decode"]["fits"] is False


def test_a_plan_that_does_not_fit_exits_1_saying_so() -> None:
    """A KV pool of -80 GiB per rank is a finding CI must see, not a table row that exits 0."""
    bad = REPO / "examples" / "unsafe" / "r008-plan-does-not-fit.yaml"
    result = CliRunner().invoke(main, ["plan", "-f", str(bad)])
    assert result.exit_code == 1
    assert "KV pool GiB" in result.stdout and "-80.43" in result.stdout  # the plan still shows
    for role in ("prefill", "decode"):
        assert f"DSV4-R008 spec.{role}.tensorParallel: {role} does not fit" in result.stderr
    assert "unsafe-r008: INVALID (2 error findings)" in result.stderr
    _, payload = run_json("plan", "-f", str(bad))
    assert {(f["rule"], f["field"]) for f in payload["documents"][0]["findings"]} == {
        ("DSV4-R008", "spec.prefill.tensorParallel"),
        ("DSV4-R008", "spec.decode.tensorParallel"),
    }


@pytest.mark.parametrize("path", UNSAFE, ids=lambda p: p.stem)
def test_plan_exits_1_on_every_document_validate_calls_invalid(path: Path) -> None:
    """`dsv4 plan` judges a document as `dsv4 validate` does: the same error findings, exit 1,
    whether or not a plan could be drawn (docs/cli.md#exit-codes)."""
    validate_code, validated = run_json("validate", "-f", str(path))
    plan_code, planned = run_json("plan", "-f", str(path))
    assert validate_code == plan_code == 1
    errors = [f for f in all_findings(validated) if f["severity"] == "error"]
    assert all_findings(planned) == errors


def test_plan_has_one_shape_for_one_or_many_documents(tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    unplannable = yaml.safe_load(EXAMPLE.read_text())
    unplannable["metadata"]["name"] = "broken"
    unplannable["spec"]["engine"]["indexKDtype"] = "int8"
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([doc, unplannable]))
    code, payload = run_json("plan", "-f", str(path))
    assert code == 1  # one document could not be planned; both are reported
    first, second = payload["documents"]
    assert first["plan"]["roles"]["decode"]["fits"] is True and first["findings"] == []
    assert second["name"] == "broken" and second["plan"] is None
    assert ("schema", "spec.engine.indexKDtype") in {
        (f["rule"], f["field"]) for f in second["findings"]
    }


def test_render_is_deterministic_and_refuses_invalid() -> None:
    first, second = run("render", "-f", str(EXAMPLE)), run("render", "-f", str(EXAMPLE))
    assert first[0] == 0 and first == second
    kinds = [d["kind"] for d in yaml.safe_load_all(first[1])]
    assert kinds.count("StatefulSet") == 2 and "Deployment" in kinds
    code, out = run(
        "render", "-f", str(REPO / "examples" / "unsafe" / "r002-bf16-multistream.yaml")
    )
    assert code == 1 and "DSV4-R002" in out and "nothing rendered" in out


def test_render_reads_stdin_and_namespace_flag() -> None:
    code, out = run("render", "-f", "-", "-n", "serving", stdin=EXAMPLE.read_text())
    assert code == 0
    assert {d["metadata"]["namespace"] for d in yaml.safe_load_all(out)} == {"serving"}


def test_crd_and_rules_commands() -> None:
    code, out = run("crd")
    assert code == 0 and (REPO / "crds" / "dsv4.io_dsv4deployments.yaml").read_text() == out
    code, payload = run_json("rules")
    rules = payload["rules"]
    assert code == 0 and all(re.fullmatch(r"DSV4-R\d{3}", r["id"]) for r in rules)
    assert {"id", "severity", "acknowledgeable", "reference", "fixedBy"} <= set(rules[0])


def test_validate_applies_the_operators_trust_policy_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["model"]["cache"] = {"hostPath": {"path": "/mnt/models/dsv4"}}
    path = tmp_path / "host.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out = run("validate", "-f", str(path))
    assert code == 1 and "allows no hostPath" in out
    monkeypatch.setenv("DSV4_HOST_PATH_PREFIXES", "/mnt/models")
    assert run("validate", "-f", str(path))[0] == 0
    monkeypatch.setenv("DSV4_MIN_CANARY_INTERVAL", "soon")
    code, out = run("validate", "-f", str(path))
    assert code == 2 and "DSV4_MIN_CANARY_INTERVAL" in out


def test_a_list_as_metadata_is_bad_input_not_a_crash() -> None:
    code, out = run(
        "validate",
        "-f",
        "-",
        stdin="apiVersion: dsv4.io/v1alpha1\nkind: DSV4Deployment\nmetadata: [x]\nspec: {}\n",
    )
    assert code == 2 and "metadata must be a mapping" in out


@pytest.mark.parametrize(
    ("toleration", "message"),
    [
        ({"key": "gpu", "operator": "Exists", "value": "x"}, "value must be empty"),
        ({"operator": "Equal", "value": "x"}, "operator must be Exists when key is empty"),
        (
            {"key": "gpu", "value": "x", "effect": "NoSchedule", "tolerationSeconds": 5},
            "only allowed with effect NoExecute",
        ),
    ],
)
def test_tolerations_the_api_server_would_refuse_are_refused(
    tmp_path: Path, toleration: dict[str, Any], message: str
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["decode"]["tolerations"] = [toleration]
    path = tmp_path / "toleration.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, payload = run_json("validate", "-f", str(path))
    assert code == 1
    [finding] = all_findings(payload)
    assert finding["field"] == "spec.decode.tolerations[0]" and message in finding["message"]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("pool name", "the name part"),
        ("a/b/c", "the prefix before '/'"),
        ("Example.com/pool", "the prefix before '/'"),
        ("x" * 64, "the name part"),
        ("example.com/", "the name part"),
        ("-pool", "the name part"),
    ],
)
def test_label_keys_the_api_server_would_refuse_are_refused(
    tmp_path: Path, key: str, message: str
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["decode"]["nodeSelector"] = {key: "a"}
    path = tmp_path / "selector.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, payload = run_json("validate", "-f", str(path))
    assert code == 1
    [finding] = all_findings(payload)
    assert finding["field"].startswith("spec.decode.nodeSelector") and message in finding["message"]


@pytest.mark.parametrize("key", ["pool", "example.com/pool", "a.b-c_d", "x" * 63])
def test_valid_label_keys_are_accepted(tmp_path: Path, key: str) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["decode"]["nodeSelector"] = {key: "a"}
    doc["spec"]["decode"]["tolerations"] = [{"key": key, "operator": "Exists"}]
    path = tmp_path / "selector.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, _ = run_json("validate", "-f", str(path))
    assert code == 0


@pytest.mark.parametrize("command", sorted(EXIT_CODES))
def test_help_states_the_exit_codes_the_docs_state(command: str) -> None:
    """`dsv4 COMMAND --help` ends with the codes docs/cli.md and the README are generated from,
    word for word (test_docs checks those pages against the same table)."""
    code, out = run(command, "--help")
    assert code == 0
    text = " ".join(out.split())
    for exit_code, meaning in EXIT_CODES[command]:
        assert f"Exit {exit_code}: {' '.join(meaning.split())}." in text


def test_dsv4_help_says_what_a_usage_error_exits_with() -> None:
    _, out = run("--help")
    assert USAGE_ERROR in " ".join(out.split())


def test_dsv4_help_lists_each_command_imported_on_demand_by_its_own_short_help() -> None:
    """`dsv4 --help` lists `probe`, `selftest` and `bisect` from summaries kept beside their
    import paths (so that it imports none of them); a summary that drifts from the command's
    own help fails here."""
    lazy = main.lazy
    assert set(lazy) == {"bisect", "probe", "selftest"}
    for name, entry in lazy.items():
        module, _, attribute = entry.path.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        assert entry.summary == command.get_short_help_str(limit=1000), name
    code, listing = run("--help")
    assert code == 0
    for name in lazy:
        assert re.search(rf"^  {name} +\S", listing, re.MULTILINE), listing

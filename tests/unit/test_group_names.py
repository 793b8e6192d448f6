"""A multi-node deployment's name bounds its LeaderWorkerSet groups' worker StatefulSets
(`<lws>-<group index>`): refused above the bound by `dsv4 validate` and the webhook, rendered
at it; single-node deployments keep the longer bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from dsv4_operator.api.limits import MAX_ROLE_REPLICAS
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.cli import main
from dsv4_operator.engine.validation import validate_object
from dsv4_operator.handlers.admission import check
from dsv4_operator.names import (
    MAX_DEPLOYMENT_NAME_LENGTH,
    MAX_GROUP_INDEX,
    MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH,
    STATEFULSET_NAME_LIMIT,
    longest_group_child_name,
)
from dsv4_operator.render.children import render_spec
from dsv4_operator.trust import Placement
from tests.support.builders import with_changes
from tests.support.paths import EXAMPLE, REPO

PRO_EXAMPLE = REPO / "examples" / "dsv4-pro-pd-h200.yaml"


def _pro(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(PRO_EXAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": "llm"}
    return doc


def _name_errors(doc: dict[str, Any]) -> list[str]:
    return [f.message for f in validate_object(doc).errors if f.field == "metadata.name"]


async def _no_refusal(name: str, namespace: str, spec: DSV4DeploymentSpec) -> list[str]:
    return []


def test_the_bound_leaves_room_for_the_last_group_index() -> None:
    assert MAX_GROUP_INDEX == MAX_ROLE_REPLICAS - 1
    name = "a" * MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH
    assert len(longest_group_child_name(name)) == STATEFULSET_NAME_LIMIT
    assert MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH == 29


def test_a_multi_node_name_at_the_bound_passes_and_its_groups_names_fit() -> None:
    name = "p" * MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH
    validation = validate_object(_pro(name))
    assert validation.valid and validation.spec is not None, validation.errors
    groups = [
        c for c in render_spec(name, "llm", validation.spec) if c["kind"] == "LeaderWorkerSet"
    ]
    assert groups
    for lws in groups:
        # The last group's worker StatefulSet (and so its pods' revision label) fits.
        assert len(f"{lws['metadata']['name']}-{MAX_GROUP_INDEX}") <= STATEFULSET_NAME_LIMIT


def test_a_multi_node_name_above_the_bound_is_refused_naming_the_field_and_maximum() -> None:
    name = "p" * (MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH + 1)
    [message] = _name_errors(_pro(name))
    assert "at most 29" in message and "shorten metadata.name" in message
    assert "spec.prefill, spec.decode" in message
    assert repr(longest_group_child_name(name)) in message


def test_a_single_node_name_keeps_the_longer_bound() -> None:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": "s" * MAX_DEPLOYMENT_NAME_LENGTH, "namespace": "llm"}
    assert _name_errors(doc) == []


def test_one_multi_node_role_is_enough_for_the_bound() -> None:
    doc = with_changes(_pro("p" * 30), {"spec.prefill.tensorParallel": 8})
    [message] = _name_errors(doc)
    assert "(spec.decode)" in message


async def test_the_webhook_refuses_a_multi_node_name_above_the_bound() -> None:
    too_long = "p" * (MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH + 1)
    at_bound = too_long[:-1]
    spec = _pro(too_long)["spec"]
    errors, _ = await check(spec, Placement(too_long, "llm"), dry_run=_no_refusal)
    assert any(e.startswith("metadata.name:") and "at most 29" in e for e in errors), errors
    errors, _ = await check(spec, Placement(at_bound, "llm"), dry_run=_no_refusal)
    assert errors == []


@pytest.mark.parametrize(("extra", "code"), [(0, 0), (1, 1)])
def test_dsv4_validate_refuses_only_above_the_bound(tmp_path: Path, extra: int, code: int) -> None:
    path = tmp_path / "pro.yaml"
    name = "p" * (MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH + extra)
    path.write_text(yaml.safe_dump(_pro(name)))
    result = CliRunner().invoke(main, ["validate", "-f", str(path)])
    assert result.exit_code == code, result.output
    assert ("at most 29" in result.output) == bool(extra)

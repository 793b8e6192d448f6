"""The chart's part in culprit searches: the shadow pairs' PriorityClass (below serving, never
preempting) and the operator told its name, rendered by the real `helm`."""

from __future__ import annotations

from typing import Any

import pytest

from dsv4_operator.names import DEFAULT_BISECT_PRIORITY_CLASS
from dsv4_operator.settings import OperatorSettings

from .support import CHART, by_kind, helm_args, one, render, run, tool


def _operator_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_shadow_pairs_get_a_priority_class_below_serving_that_never_preempts() -> None:
    objects = render()
    priority = one(objects, "PriorityClass")
    # One per release: a PriorityClass is cluster-scoped, and two releases (two watched
    # namespace sets) in one cluster must not claim the same one.
    assert priority["metadata"]["name"] == "dsv4-operator-bisect"
    other = one(render(release="tenant-b", namespace="b"), "PriorityClass")
    assert other["metadata"]["name"] == "tenant-b-dsv4-operator-bisect"
    assert priority["preemptionPolicy"] == "Never"
    assert priority["value"] < 0  # serving pods without a PriorityClass run at 0
    assert priority["globalDefault"] is False
    env = _operator_env(objects)
    assert env["DSV4_BISECT_PRIORITY_CLASS"] == "dsv4-operator-bisect"
    # Without the chart (`dsv4 run` by hand) the operator names its own default.
    assert OperatorSettings().bisect_priority_class == DEFAULT_BISECT_PRIORITY_CLASS


def test_the_priority_class_can_be_renamed_or_left_to_the_cluster() -> None:
    renamed = render({"guard": {"bisect": {"priorityClass": {"name": "probes", "value": -5}}}})
    assert one(renamed, "PriorityClass")["metadata"]["name"] == "probes"
    assert _operator_env(renamed)["DSV4_BISECT_PRIORITY_CLASS"] == "probes"
    own = render({"guard": {"bisect": {"priorityClass": {"create": False, "name": "theirs"}}}})
    assert by_kind(own, "PriorityClass") == []
    assert _operator_env(own)["DSV4_BISECT_PRIORITY_CLASS"] == "theirs"


@pytest.mark.parametrize("value", [0, 1000])
def test_values_schema_refuses_a_priority_at_or_above_serving(value: int) -> None:
    values = {"guard": {"bisect": {"priorityClass": {"value": value}}}}
    proc = run([tool("helm"), "template", "x", CHART, *helm_args(values)], check=False)
    assert proc.returncode != 0
    assert "/guard/bisect/priorityClass/value" in proc.stderr

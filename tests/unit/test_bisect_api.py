"""`spec.guard.bisect` and the culprit search's status: defaults, refusals naming the field, the
CRD keeping the search state, and the state and answer carried across the guard's passes."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dsv4_operator.api.bisect import BisectState, CulpritStatus
from dsv4_operator.api.crd import openapi_schema
from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.api.status import DSV4DeploymentStatus, GuardStatus, parse_status
from dsv4_operator.guard.decision import GuardInput, decide_guard
from dsv4_operator.guard.observations import Snapshot
from tests.support.builders import NOW

STATE = {
    "goodRevision": "g00d",
    "badRevision": "b4d",
    "generation": 3,
    "startedAt": "2026-01-01T00:00:00Z",
    "search": {"units": [["--enable-hierarchical-cache"]], "granularity": 2, "tested": {}},
    "active": ["p3"],
}
CULPRIT = {
    "result": "Found",
    "settings": ["--enable-hierarchical-cache", "SGLANG_DSV4_BF16_INDEX_K=1"],
    "release": "0.5.16",
    "gpuProduct": "NVIDIA-H100-80GB-HBM3",
    "goodRevision": "g00d",
    "badRevision": "b4d",
    "message": "these two settings leak together",
    "probes": [{"id": "p1", "settings": ["a"], "outcome": "fail", "responses": 40, "leaks": 9}],
    "at": "2026-01-01T01:00:00Z",
}


def test_bisect_is_off_by_default_with_bounded_budgets() -> None:
    bisect = GuardSpec().bisect
    assert not bisect.enabled
    assert (bisect.max_probes, bisect.max_parallel, bisect.max_gpus) == (24, 1, None)
    assert str(bisect.time_limit) == "2h"
    assert bisect.priority_class_name is None  # the chart's


@pytest.mark.parametrize(
    ("bisect", "field"),
    [
        ({"maxProbes": 0}, "maxProbes"),
        ({"maxParallel": 9}, "maxParallel"),
        ({"maxGpus": 0}, "maxGpus"),
        ({"timeLimit": "1m"}, "timeLimit"),
        ({"priorityClassName": "Not_A_Name"}, "priorityClassName"),
        ({"maxProbe": 3}, "maxProbe"),
    ],
)
def test_bad_bisect_settings_are_refused_naming_the_field(
    bisect: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        GuardSpec.model_validate({"bisect": bisect})


def test_the_search_state_and_the_answer_round_trip_through_status() -> None:
    wire = {"guard": {"bisect": STATE, "culprit": CULPRIT}}
    status = parse_status(wire)
    assert status.guard is not None and status.guard.bisect is not None
    assert status.guard.bisect.search == STATE["search"]
    assert status.guard.culprit == CulpritStatus.model_validate(CULPRIT)
    assert parse_status(status.to_wire()) == status
    # Not live fields: a change to either is written at once (it is what a resume reads).
    visible = status.visible_wire()["guard"]
    assert isinstance(visible, dict)
    assert BisectState.model_validate(visible["bisect"]) == status.guard.bisect


def test_the_crd_keeps_the_free_form_search_state() -> None:
    guard = openapi_schema()["properties"]["status"]["properties"]["guard"]["properties"]
    search = guard["bisect"]["properties"]["search"]
    # Without it the API server prunes every key of the state and the search cannot resume.
    assert search.get("x-kubernetes-preserve-unknown-fields") is True
    spec_guard = openapi_schema()["properties"]["spec"]["properties"]["guard"]["properties"]
    assert spec_guard["bisect"]["properties"]["enabled"]["default"] is False


def test_a_guard_pass_keeps_the_search_state_and_the_answer() -> None:
    previous = GuardStatus(
        revision="g00d",
        bisect=BisectState.model_validate(STATE),
        culprit=CulpritStatus.model_validate(CULPRIT),
    )
    given = GuardInput(
        deployment="x",
        policy=GuardSpec(),
        last_known_good="g00d",
        previous=previous,
        quarantine=[],
        conditions=[],
        snapshot=Snapshot(revision="g00d", samples=3000, leaks=0),
        pods=[],
        user_revision="g00d",
        known_good_target="g00d",
        settled_revision="g00d",
        cleared=None,
        now=NOW,
    )
    guard = decide_guard(given).guard
    assert guard is not None
    assert guard.samples == 3000  # a new window's judgement ...
    assert guard.bisect == previous.bisect  # ... with the search and its answer kept
    assert guard.culprit == previous.culprit
    visible = DSV4DeploymentStatus(guard=guard).visible_wire()["guard"]
    assert isinstance(visible, dict)
    assert CulpritStatus.model_validate(visible["culprit"]) == previous.culprit

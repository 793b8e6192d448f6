"""The API's times: a Duration or Timestamp is parsed once, when the model is validated, and
goes back to the wire exactly as it was written."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from dsv4_operator.api.guard import GuardSpec, OomSpec
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus, GuardStatus, QuarantineEntry
from dsv4_operator.api.times import DURATION_PATTERN, Duration, Timestamp
from dsv4_operator.names import format_time
from dsv4_operator.revisions.hashing import canonical_hash
from tests.support.builders import example_doc


def _duration_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted (python) paths of every field whose schema has the Duration pattern."""
    schema = model.model_json_schema(mode="validation")
    defs = schema.get("$defs", {})
    found: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if "$ref" in node:
            node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **node}
            node.pop("$ref")
        if node.get("pattern") == DURATION_PATTERN:
            found.append(path)
        for branch in node.get("anyOf", []):
            walk(branch, path)
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}" if path else name)

    walk(schema, prefix)
    return found


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def test_every_duration_of_the_spec_is_parsed_once() -> None:
    spec = DSV4DeploymentSpec.model_validate(example_doc()["spec"])
    paths = _duration_paths(DSV4DeploymentSpec)
    assert {
        "guard.canary.interval",
        "guard.tap.interval",
        "guard.oom.window",
        "guard.bakeTime",
        "monitoring.serviceMonitor.interval",
    } <= set(paths)
    for path in paths:
        python = ".".join(
            "".join("_" + c.lower() if c.isupper() else c for c in part) for part in path.split(".")
        )
        value = _at(spec, python)
        assert isinstance(value, Duration), path
        assert isinstance(value.delta, timedelta), path


@pytest.mark.parametrize(
    ("text", "delta"),
    [("10m", timedelta(minutes=10)), ("90s", timedelta(seconds=90)), ("1h", timedelta(hours=1))],
)
def test_a_duration_keeps_its_text_and_carries_its_value(text: str, delta: timedelta) -> None:
    oom = OomSpec(window=text)
    assert isinstance(oom.window, Duration) and oom.window.delta == delta
    wire = oom.to_wire()
    assert wire["window"] == text and type(wire["window"]) is str
    assert json.loads(oom.model_dump_json(by_alias=True))["window"] == text
    # The parsed value survives the copies a model goes through.
    assert copy.deepcopy(oom).window.delta == delta
    assert OomSpec.model_validate_json(oom.model_dump_json()).window.delta == delta


def test_the_spec_serialises_as_written_so_revision_hashes_stay() -> None:
    doc = example_doc()["spec"]
    doc.setdefault("guard", {})["bakeTime"] = "600s"  # not normalised to 10m
    spec = DSV4DeploymentSpec.model_validate(doc)
    assert spec.guard.bake_time == "600s" and spec.guard.bake_time.delta == timedelta(minutes=10)
    wire: dict[str, Any] = spec.to_wire()
    assert wire["guard"]["bakeTime"] == "600s"
    # The hash of the spec as stored reads the text, not the parsed value.
    written = canonical_hash(json.loads(json.dumps(wire)))
    assert canonical_hash(wire) == written
    doc["guard"]["bakeTime"] = "10m"
    assert canonical_hash(DSV4DeploymentSpec.model_validate(doc).to_wire()) != written


def test_duration_bounds_and_shape_are_checked_before_anything_reads_them() -> None:
    with pytest.raises(ValidationError, match="must be at least 1m"):
        OomSpec(window="30s")
    with pytest.raises(ValidationError, match="should match pattern"):
        OomSpec(window="10 minutes")
    assert GuardSpec().bake_time.delta == timedelta(minutes=10)


def test_a_timestamp_keeps_its_text_and_carries_its_time() -> None:
    now = datetime(2026, 11, 29, 12, 0, 5, 123456, tzinfo=UTC)
    stamp = Timestamp.of(now)
    assert stamp == format_time(now) == "2026-11-29T12:00:05Z"
    assert stamp.at == now.replace(microsecond=0)
    guard = GuardStatus(since=stamp, passing_since="2026-11-29T11:00:00Z")
    assert guard.passing_since is not None
    assert guard.passing_since.at == datetime(2026, 11, 29, 11, 0, tzinfo=UTC)
    wire = guard.to_wire()
    assert wire["since"] == "2026-11-29T12:00:05Z" and type(wire["since"]) is str


def test_status_times_are_parsed_when_the_status_is() -> None:
    status = DSV4DeploymentStatus.model_validate(
        {
            "guard": {"since": "2026-11-29T10:00:00Z", "lastSampleTime": "2026-11-29T10:01:00Z"},
            "quarantine": [{"hash": "h", "reason": "OOM", "at": "2026-11-29T10:02:00Z"}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AllReplicasReady",
                    "lastTransitionTime": "2026-11-29T10:03:00Z",
                }
            ],
        }
    )
    assert status.guard is not None and status.guard.since is not None
    assert status.guard.since.at == datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert status.quarantine[0].at.at == datetime(2026, 11, 29, 10, 2, tzinfo=UTC)
    transition = status.conditions[0].last_transition_time
    assert transition is not None and transition.at.minute == 3


def test_a_text_that_is_no_time_does_not_validate() -> None:
    with pytest.raises(ValidationError):
        QuarantineEntry(hash="h", reason="OOM", at="yesterday")
    with pytest.raises(ValidationError):
        GuardStatus(since="")

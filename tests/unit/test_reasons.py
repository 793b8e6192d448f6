"""The catalogue of reasons (reasons.py): complete, described, the only source of reasons, and
the type of the guard verdicts in status."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsv4_operator import reasons
from dsv4_operator.api.crd import openapi_schema
from dsv4_operator.api.status import DSV4DeploymentStatus, parse_status
from dsv4_operator.reasons import (
    CATALOGUE,
    ConditionReason,
    EventReason,
    GuardReason,
    GuardResult,
    Reason,
    RollbackReason,
    WeightsReason,
    weights_event_reason,
)
from dsv4_operator.weights.progress import FailureReason

PACKAGE = Path(reasons.__file__).resolve().parent

# The wire strings as they were before the catalogue: a value that changes here is an API change.
WIRE = {
    "GuardResult": {"Pass", "Fail", "NoData", "Error"},
    "GuardReason": {
        "OOMBeforeBake",
        "OOMEvents",
        "SourceError",
        "PrometheusLeakRate",
        "TrafficLeakRate",
        "EngineToolCallDrops",
        "KVIntegrity",
        "TooFewSamples",
        "LeakRate",
        "Inconclusive",
        "NoData",
    },
    "RollbackReason": {"LeakRate", "OOM", "NoData", "KVIntegrity"},
    "EventReason": {
        "RolledBack",
        "Baked",
        "QuarantineCleared",
        "GuardBlind",
        "NoKnownGood",
        "PlanMismatch",
        "BisectStarted",
        "CulpritFound",
        "CulpritNotFound",
        "Creating",
        "RollingUpdate",
        "ChildRecreated",
        "Recreate",
        "BlueGreenStarted",
        "RouterSwitched",
        "OldPairDeleted",
        "OrphansDeleted",
        "RevisionCreated",
        "Invalid",
        "ChildRejected",
        "CRDMissing",
        "GroupRestarted",
        "GroupsUnavailable",
        "WeightsPending",
        "WeightsDownloading",
        "WeightsVerifying",
        "WeightsTokenSecretMissing",
        "WeightsDownloadFailed",
        "WeightsUnauthorized",
        "WeightsNotFound",
        "WeightsDiskFull",
        "WeightsVerifyFailed",
        "WeightsHubUnavailable",
        "WeightsModelMissing",
        "WeightsModelMismatch",
        "ModelInUse",
    },
    "ConditionReason": {
        "Valid",
        "RuleViolation",
        "SchemaInvalid",
        "SpecInvalid",
        "Creating",
        "RollingUpdate",
        "Recreating",
        "BlueGreen",
        "SwitchingRouter",
        "CleaningUp",
        "WaitingForWeights",
        "Quarantined",
        "RolloutComplete",
        "ChildRejected",
        "AllReplicasReady",
        "ReplicasNotReady",
        "WeightsNotReady",
        "AsExpected",
        "ReplicasUnavailable",
        "Unschedulable",
        "ImagePullBackOff",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "ProgressDeadlineExceeded",
        "WeightsFailed",
        "NoKnownGood",
        "NotRolledBack",
        "Seeing",
        "SourceErrors",
        "Verified",
        "PlanMismatch",
        "NotAnswered",
        "EngineCounts",
        "NoDropCounter",
        "Bisecting",
        "CulpritIdentified",
        "NotReproduced",
        "NoCulprit",
        "Applied",
        "Referenced",
        "Unused",
        "DeletionWaits",
        "Disabled",
        "CRDMissing",
        "GroupsUnavailable",
    },
    "WeightsReason": {
        "Pending",
        "Downloading",
        "Verifying",
        "TokenSecretMissing",
        "Downloaded",
        "DownloadFailed",
        "Unauthorized",
        "NotFound",
        "DiskFull",
        "VerifyFailed",
        "HubUnavailable",
        "ModelMissing",
        "ModelMismatch",
    },
}

# Where a reason is passed: callee name -> (positional indexes, keyword names). What is given
# there must be a catalogue member (or computed from one), never a string literal.
REASON_ARGUMENTS: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
    "Note": ((1,), ("reason",)),
    "note": ((1,), ("reason",)),  # reconcile.actions.Actions.note
    "_condition": ((3,), ("reason",)),  # reconcile.status
    "Condition": ((), ("reason",)),
    "Progress": ((0,), ("reason",)),
    "GuardVerdict": ((0, 1, 3), ("outcome", "reason", "rollback_reason")),
    "WeightsState": ((1,), ("reason",)),
    "QuarantineEntry": ((), ("reason",)),
}


def test_the_catalogue_lists_every_reason_class() -> None:
    defined = {
        value
        for value in vars(reasons).values()
        if isinstance(value, type) and issubclass(value, Reason) and value is not Reason
    }
    assert set(CATALOGUE) == defined


@pytest.mark.parametrize("catalogue", CATALOGUE, ids=lambda c: c.__name__)
def test_values_are_todays_wire_strings_each_once(catalogue: type[Reason]) -> None:
    # Two members with one value would make the second an alias, its description lost.
    assert len(catalogue.__members__) == len(list(catalogue))
    assert {member.value for member in catalogue} == WIRE[catalogue.__name__]


@pytest.mark.parametrize("catalogue", CATALOGUE, ids=lambda c: c.__name__)
def test_every_member_says_when_and_what_to_do(catalogue: type[Reason]) -> None:
    for member in catalogue:
        assert member.description.strip(), member
        assert member.description.rstrip().endswith("."), member
        assert member.value[0].isupper() and member.value.isalnum(), member  # CamelCase


def test_a_member_is_its_string_on_the_wire() -> None:
    assert f"{EventReason.ROLLED_BACK}" == "RolledBack" == str(EventReason.ROLLED_BACK)
    assert EventReason("RolledBack") is EventReason.ROLLED_BACK


def test_weights_failures_and_their_events_are_catalogued() -> None:
    assert {failure.reason for failure in FailureReason} <= set(WeightsReason)
    for reason in WeightsReason:
        if reason is not WeightsReason.DOWNLOADED:  # an Event is posted only while not ready
            assert weights_event_reason(reason) in set(EventReason)


def test_the_monitoring_warning_event_is_the_condition_reason() -> None:
    # reconcile.decide posts MonitoringReady=False's reason as the Event reason.
    assert ConditionReason.CRD_MISSING.value in set(EventReason)


def _literals(expr: ast.expr) -> Iterator[ast.expr]:
    """String literals an expression can evaluate to (through `x if c else y` and `a or b`)."""
    if isinstance(expr, ast.JoinedStr) or (
        isinstance(expr, ast.Constant) and isinstance(expr.value, str)
    ):
        yield expr
    elif isinstance(expr, ast.IfExp):
        yield from _literals(expr.body)
        yield from _literals(expr.orelse)
    elif isinstance(expr, ast.BoolOp):
        for value in expr.values:
            yield from _literals(value)


def _reason_arguments(tree: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name not in REASON_ARGUMENTS:
            continue
        indexes, keywords = REASON_ARGUMENTS[name]
        yield from (node.args[i] for i in indexes if i < len(node.args))
        yield from (k.value for k in node.keywords if k.arg in keywords)


def test_no_reason_is_a_string_literal_in_the_operator() -> None:
    checked = 0
    left: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for argument in _reason_arguments(tree):
            checked += 1
            left += [
                f"{path.relative_to(PACKAGE)}:{literal.lineno}: {ast.unparse(literal)}"
                for literal in _literals(argument)
            ]
    assert not left, "reasons written as literals, not reasons.py members:\n" + "\n".join(left)
    assert checked >= 60, checked  # the walk still finds the call sites


def test_guard_verdicts_in_status_are_catalogue_members_and_plain_strings_on_the_wire() -> None:
    status = DSV4DeploymentStatus.model_validate(
        {
            "guard": {"lastVerdict": "Fail", "lastReason": "OOMEvents"},
            "quarantine": [{"hash": "h", "reason": "OOM", "at": "2026-11-29T12:00:00Z"}],
        }
    )
    assert status.guard is not None
    assert status.guard.last_verdict is GuardResult.FAIL
    assert status.guard.last_reason is GuardReason.OOM_EVENTS
    assert status.quarantine[0].reason is RollbackReason.OOM
    wire = status.to_wire()
    assert wire["guard"] == {  # plain strings, as before
        "lastVerdict": "Fail",
        "lastReason": "OOMEvents",
        "samples": 0,
        "leaks": 0,
        "trafficSamples": 0,
        "trafficLeaks": 0,
        "engineSamples": 0,
        "engineLeaks": 0,
        "kvRequests": 0,
        "kvFailures": 0,
        "oomEvents": 0,
        "consecutiveErrors": 0,
    }
    assert all(type(v) is str for v in (wire["guard"]["lastVerdict"], wire["guard"]["lastReason"]))


def test_a_reason_this_operator_does_not_know_keeps_the_status_and_its_quarantine() -> None:
    """A newer operator may write a reason this one lacks (read after a downgrade): the status
    still parses, the quarantine stays (losing it would roll the rejected revision out again)
    and the unknown value is written back as it was."""
    raw = {
        "lastKnownGoodRevision": "good",
        "guard": {"lastVerdict": "Fail", "lastReason": "KVChecksum"},
        "quarantine": [{"hash": "bad", "reason": "ThermalThrottle", "at": "2026-11-29T12:00:00Z"}],
    }
    status = parse_status(raw)
    assert status.last_known_good_revision == "good"
    assert [q.hash for q in status.quarantine] == ["bad"]
    assert status.quarantine[0].reason == "ThermalThrottle"
    assert status.guard is not None and status.guard.last_verdict is GuardResult.FAIL
    wire: dict[str, Any] = status.to_wire()
    assert wire["quarantine"][0]["reason"] == "ThermalThrottle"
    assert wire["guard"]["lastReason"] == "KVChecksum"


def test_the_crd_keeps_the_verdict_fields_plain_strings() -> None:
    """Typed in the model, the CRD's status schema is what it was: strings, no `enum:`."""
    status = openapi_schema()["properties"]["status"]["properties"]
    guard = status["guard"]["properties"]
    for field in (guard["lastVerdict"], guard["lastReason"]):
        assert field["type"] == "string" and "enum" not in field
    reason = status["quarantine"]["items"]["properties"]["reason"]
    assert reason["type"] == "string" and "enum" not in reason


def test_every_condition_reason_names_its_condition_and_status() -> None:
    """The docs' condition table is read from the descriptions' `Type=Status:` openings."""
    from typing import get_args

    from dsv4_operator.api.status import ConditionType
    from dsv4_operator.reasons import ConditionReason, condition_rows

    rows = condition_rows()
    assert len([r for r in rows if r[2] in ConditionReason._value2member_map_]) >= len(
        ConditionReason
    )
    for condition, status, reason, text in rows:
        assert condition in get_args(ConditionType), reason
        assert status in ("True", "False"), reason
        assert text, reason

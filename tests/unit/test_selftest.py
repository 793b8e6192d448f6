"""`dsv4 selftest` (what `helm test` runs): its judgements, its two specs, its JSON contract."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from dsv4_operator.engine.validation import validate_object
from dsv4_operator.kube.errors import KubeError, error_for
from dsv4_operator.selftest import (
    UNSAFE_RULE,
    await_leader,
    judge_deployment,
    judge_lease,
    judge_sound,
    judge_unsafe,
    spec_document,
)
from dsv4_operator.settings import OperatorSettings

NOW = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)
IMAGE = "registry.example.com/dsv4-engine:0.5.16-p3"
DENIED = error_for(
    422,
    "Invalid",
    'admission webhook "rules.dsv4.io.validation" denied the request: DSV4-R001 '
    "spec.engine.hicache.enabled: bf16 index-K with HiCache ...",
)
UNREACHABLE = error_for(
    500,
    "InternalError",
    'Internal error occurred: failed calling webhook "rules.dsv4.io.validation": failed to '
    'call webhook: Post "https://dsv4-op-webhook.ops.svc:443/rules": connection refused',
)


def _errors(doc: dict[str, object]) -> list[str]:
    validation = validate_object(doc, OperatorSettings().trust_policy)
    return [f.rule for f in validation.findings if f.severity == "error"]


def test_the_sound_spec_passes_the_rules_and_the_unsafe_one_breaks_exactly_r001() -> None:
    assert _errors(spec_document("s", "ns", IMAGE)) == []
    assert _errors(spec_document("s", "ns", IMAGE, unsafe=True)) == [UNSAFE_RULE]


def _lease(holder: str, renewed: dt.datetime, duration: int = 15) -> dict[str, object]:
    stamp = renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": holder, "renewTime": stamp, "leaseDurationSeconds": duration}
    return {"spec": spec}


def test_lease_judgement() -> None:
    fresh = judge_lease("dsv4", _lease("pod-a", NOW - dt.timedelta(seconds=3)), NOW)
    assert (fresh.ok, fresh.reason) == (True, "Leading")
    assert "pod-a" in fresh.message
    stale = judge_lease("dsv4", _lease("pod-a", NOW - dt.timedelta(seconds=40)), NOW)
    assert (stale.ok, stale.reason) == (False, "LeaseExpired")
    assert "40s ago" in stale.message
    released = judge_lease("dsv4", _lease("", NOW), NOW)
    assert (released.ok, released.reason) == (False, "NoLeader")
    assert judge_lease("dsv4", None, NOW).reason == "NoLease"


def test_deployment_judgement() -> None:
    up = {"spec": {"replicas": 2}, "status": {"availableReplicas": 1}}
    assert judge_deployment("op", up).ok
    assert "1/2" in judge_deployment("op", up).message
    down = {"spec": {"replicas": 2}, "status": {}}
    assert judge_deployment("op", down).reason == "OperatorUnavailable"
    assert judge_deployment("op", None).reason == "OperatorMissing"


def test_admission_judgements_tell_a_broken_webhook_from_a_refusing_one() -> None:
    assert judge_sound(None).ok
    assert judge_sound(UNREACHABLE).reason == "WebhookCallFailed"
    assert judge_sound(DENIED).reason == "SoundRefused"
    forbidden = error_for(403, "Forbidden", 'cannot create resource "dsv4deployments"')
    assert judge_sound(forbidden).reason == "Forbidden"
    assert judge_unsafe(DENIED).ok
    assert judge_unsafe(None).reason == "UnsafeAdmitted"
    assert judge_unsafe(UNREACHABLE).reason == "WebhookCallFailed"
    schema_refusal = KubeError(422, "Invalid", "spec.engine.indexKDtype: Unsupported value")
    assert judge_unsafe(schema_refusal).reason == "RefusedElsewhere"


class _Leases:
    """The Lease as successive reads find it (the last one stays)."""

    def __init__(self, *reads: dict[str, object] | None) -> None:
        self.reads = list(reads)

    async def get(self, res: Any, namespace: str, name: str) -> dict[str, object] | None:
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]


def _leader(leases: _Leases, wait: float) -> tuple[Any, list[float]]:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    client: Any = leases
    return asyncio.run(await_leader(client, "ops", "dsv4", lambda: NOW, sleep, wait)), slept


def test_a_lease_being_handed_over_is_read_again_until_a_replica_takes_it() -> None:
    """A rolling update's old leader releases the Lease as it stops; `helm test` right after
    `rollout status` read it released and failed, though a standby took it a second later."""
    handover = _Leases(_lease("", NOW), _lease("", NOW), _lease("pod-b", NOW))
    check, slept = _leader(handover, wait=30)
    assert (check.ok, check.reason) == (True, "Leading") and "pod-b" in check.message
    assert slept == [1.0, 1.0]
    # Nobody takes it: the check fails after the wait, and says it waited.
    check, slept = _leader(_Leases(_lease("", NOW)), wait=5)
    assert (check.ok, check.reason) == (False, "NoLeader")
    assert check.message.endswith("(read again for 5s)") and len(slept) == 5
    # No wait (--leader-wait 0): one read.
    check, slept = _leader(_Leases(None), wait=0)
    assert (check.reason, slept) == ("NoLease", [])
    assert check.message == "Lease dsv4 not found: no replica ever led"

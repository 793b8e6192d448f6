"""Leader election's takeover rule (runtime/lease.py), on the injected monotonic clock."""

from __future__ import annotations

from typing import Any

from dsv4_operator.runtime.lease import (
    Observed,
    Timing,
    _record,
    lease_owner_reference,
    may_take,
    with_owners,
)


def lease(holder: str, renew: str = "2026-12-01T00:00:00.000000Z", transitions: int = 0) -> Any:
    return {"spec": {"holderIdentity": holder, "renewTime": renew, "leaseTransitions": transitions}}


def test_an_empty_or_own_lease_may_be_taken_at_once() -> None:
    assert may_take(lease(""), None, "me", now=0.0, duration=15)
    assert may_take(lease("me"), None, "me", now=0.0, duration=15)


def test_another_holder_counts_from_when_this_replica_first_saw_the_record() -> None:
    held = lease("other")
    # First sight: never expired, whatever its renewTime says (clocks may be skewed).
    assert not may_take(held, None, "me", now=1000.0, duration=15)
    seen = Observed(_record(held), at=100.0)
    assert not may_take(held, seen, "me", now=114.9, duration=15)
    assert may_take(held, seen, "me", now=115.0, duration=15)


def test_a_renewal_restarts_the_count() -> None:
    seen = Observed(_record(lease("other", "2026-12-01T00:00:00.000000Z")), at=100.0)
    renewed = lease("other", "2026-12-01T00:00:02.000000Z")
    assert not may_take(renewed, seen, "me", now=500.0, duration=15)


def test_the_timing_of_a_lease_duration_keeps_client_gos_ratios() -> None:
    # 15 s gives client-go's defaults: renew every 2 s, stop leading after 10 s unrenewed.
    assert Timing.for_duration(15.0) == Timing(duration=15.0, deadline=10.0, retry=2.0)
    assert Timing.for_duration(60.0) == Timing(duration=60.0, deadline=40.0, retry=8.0)


def test_the_lease_names_its_owner_once_and_keeps_other_owners() -> None:
    deployment = {"metadata": {"name": "op", "uid": "u-1", "namespace": "ops"}}
    owner = lease_owner_reference(deployment)
    assert owner == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "op", "uid": "u-1"}
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-2"}
    once = with_owners({"name": "op", "ownerReferences": [other]}, [owner])
    assert once["ownerReferences"] == [other, owner]
    assert with_owners(once, [owner]) is once  # already there: no change, no write of it
    assert with_owners({"name": "op"}, []) == {"name": "op"}

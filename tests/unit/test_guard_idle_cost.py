"""What keeps an idle guard cheap: status written only for a change a user would see, canary
runs spread over their interval by a fixed per-deployment phase, a bound on how many run at
once across all deployments, and tap and engine reads that find nothing new coming ever less
often (up to 30 s apart), back at their interval on anything new."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from prometheus_client import REGISTRY

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus, GuardStatus
from dsv4_operator.api.times import Duration, Timestamp
from dsv4_operator.guard.observations import Key, Observations
from dsv4_operator.guard.taps import TrafficDeltas
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import GuardReason, GuardResult
from dsv4_operator.signals.canary_runner import CanaryRun, CanaryRunner
from dsv4_operator.signals.engine import EngineReader
from dsv4_operator.signals.supervisor import (
    GuardSupervisor,
    next_stretch,
    phase,
    until_slot,
)
from tests.support.builders import NOW, SettledReader, engine_pod, example_doc


def _status(**guard: Any) -> DSV4DeploymentStatus:
    base: dict[str, Any] = {
        "revision": "abc",
        "samples": 128,
        "leaks": 0,
        "leak_rate": 0.0,
        "last_verdict": GuardResult.PASS,
        "last_reason": GuardReason.LEAK_RATE,
        "last_message": "0/128 responses leaked",
        "last_sample_time": Timestamp.of(NOW),
    }
    return DSV4DeploymentStatus(phase="Ready", guard=GuardStatus(**{**base, **guard}))


def test_live_counts_alone_are_no_change_to_write() -> None:
    stored = _status()
    moved = _status(
        samples=160,
        traffic_samples=40,
        engine_samples=200,
        kv_requests=300,
        last_message="0/160 responses leaked",
        last_sample_time=Timestamp.of(NOW.replace(minute=1)),
    )
    assert moved.to_wire() != stored.to_wire()
    assert moved.visible_wire() == stored.visible_wire()


def test_a_leak_a_verdict_or_a_phase_is_a_change_to_write() -> None:
    stored = _status()
    assert _status(leaks=1).visible_wire() != stored.visible_wire()
    assert _status(traffic_leaks=1).visible_wire() != stored.visible_wire()
    assert _status(last_verdict=GuardResult.ERROR).visible_wire() != stored.visible_wire()
    # The first source error is a change (the verdict); more errors in a row are a count
    # (dsv4_guard_source_errors): a blind guard's status changes with its causes only.
    first_error = _status(last_verdict=GuardResult.ERROR, consecutive_errors=1)
    assert _status(last_verdict=GuardResult.ERROR, consecutive_errors=5).visible_wire() == (
        first_error.visible_wire()
    )
    assert _status(passing_since=Timestamp.of(NOW)).visible_wire() != stored.visible_wire()
    assert stored.model_copy(update={"phase": "Degraded"}).visible_wire() != (stored.visible_wire())


def test_phases_spread_deployments_created_together_over_the_interval() -> None:
    keys = [("ns", f"dsv4-{i:03d}") for i in range(300)]
    phases = [phase(key) for key in keys]
    assert phases == [phase(key) for key in keys]  # fixed by the key
    assert all(0 <= p < 1 for p in phases)
    # Tenths of the interval: none holds more than twice its share.
    tenths = [sum(1 for p in phases if int(p * 10) == t) for t in range(10)]
    assert max(tenths) <= 2 * len(keys) / 10, tenths


def test_a_round_waits_for_its_slot_and_an_overrun_skips_to_the_next() -> None:
    assert until_slot(now=100.0, interval=60.0, offset=30.0) == 50.0  # 100 -> 150 (2x60+30)
    assert until_slot(now=150.0, interval=60.0, offset=30.0) == 0.0
    assert until_slot(now=151.0, interval=60.0, offset=30.0) == 59.0  # late: the next slot


async def _rounds_at_once(runner: CanaryRunner, at_once: int, keys: list[Key]) -> Observations:
    """One canary round for each of `keys`, all due together, `at_once` slots between them;
    what the guard observed."""
    guards = GuardSupervisor(
        SettledReader(),
        Observations(),
        wake=lambda key: None,
        runner=runner,
        canaries_at_once=at_once,
    )
    spec = DSV4DeploymentSpec.model_validate(example_doc()["spec"])
    try:
        await asyncio.gather(*(guards._round(key, spec) for key in keys))
    finally:
        await guards.close()
    return guards.observations


async def test_at_most_canaries_at_once_run_together_across_deployments() -> None:
    in_flight = most = 0

    async def runner(endpoint: str, model: str, spec: DSV4DeploymentSpec) -> CanaryRun:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0)  # let the others in, if the bound allows them
        in_flight -= 1
        return CanaryRun({"clean": 4})

    keys = [("ns", f"d{i}") for i in range(12)]
    observed = await _rounds_at_once(runner, 3, keys)
    assert most == 3
    assert all(observed.snapshot(key) is not None for key in keys)


@pytest.mark.looptime  # the loop's clock is virtual: the waits are exact
async def test_a_canary_run_waiting_for_a_slot_is_measured() -> None:
    """Runs of 10 s, 2 at once, 6 due together: they wait 0, 0, 10, 10, 20 and 20 s, which
    dsv4_canary_slot_wait_seconds shows (the guard behind its schedule, for an operator to
    raise DSV4_GUARD_CANARIES_AT_ONCE or the interval)."""

    async def runner(endpoint: str, model: str, spec: DSV4DeploymentSpec) -> CanaryRun:
        await asyncio.sleep(10)
        return CanaryRun({"clean": 4})

    def sample(suffix: str, **labels: str) -> float:
        value = REGISTRY.get_sample_value(f"dsv4_canary_slot_wait_seconds_{suffix}", labels)
        return value or 0.0

    before = {s: sample(s) for s in ("count", "sum")}
    at_once = {s: sample("bucket", le=s) for s in ("0.01", "15.0")}
    await _rounds_at_once(runner, 2, [("ns", f"w{i}") for i in range(6)])
    assert sample("count") - before["count"] == 6
    assert sample("sum") - before["sum"] == pytest.approx(60.0, abs=0.1)
    assert sample("bucket", le="0.01") - at_once["0.01"] == 2  # the first two
    assert sample("bucket", le="15.0") - at_once["15.0"] == 4  # and the two after 10 s


@pytest.mark.looptime  # the loop's clock is virtual: the slots are reached exactly
async def test_a_deployment_found_at_start_up_waits_for_its_slot() -> None:
    """At start-up every deployment's loops begin together: none runs its canary at once
    (they used to, all of them, and kept the event loop from the first reconciles)."""
    runs: list[str] = []

    async def runner(endpoint: str, model: str, spec: DSV4DeploymentSpec) -> CanaryRun:
        runs.append(endpoint)
        return CanaryRun({"clean": 4})

    doc = example_doc()["spec"]
    doc["guard"] = {"canary": {"interval": "60s"}, "tap": {"enabled": False}}
    doc["guard"]["engine"] = {"enabled": False}
    spec = DSV4DeploymentSpec.model_validate(doc)
    now = asyncio.get_running_loop().time()
    # Keys whose slot is more than a second away (nearly all: the slot of each is somewhere
    # in the next 60 s): none may run in the next 0.2 s.
    candidates = [("ns", f"d{i}") for i in range(40)]
    keys = [k for k in candidates if until_slot(now, 60.0, phase(k) * 60.0) > 1.0][:20]
    assert len(keys) == 20
    guards = GuardSupervisor(SettledReader(), Observations(), wake=lambda key: None, runner=runner)
    try:
        for key in keys:
            guards.ensure(key, spec)
        await asyncio.sleep(0.2)
        assert runs == []
        await asyncio.sleep(60)  # every slot passed once: each deployment ran its canary
        assert len(runs) == len(keys)
    finally:
        await guards.close()


def test_an_idle_source_is_read_half_as_often_each_time_up_to_a_bound() -> None:
    stretches = [1]
    for _ in range(5):
        stretches.append(next_stretch(stretches[-1], busy=False, most=6))
    assert stretches == [1, 2, 4, 6, 6, 6]
    assert next_stretch(6, busy=True, most=6) == 1  # anything new: back at the interval
    assert next_stretch(1, busy=False, most=1) == 1  # an interval at the bound: no stretch


@pytest.mark.looptime
@pytest.mark.parametrize(
    ("every", "woken_at", "expected"),
    [
        # The default (DSV4_GUARD_IDLE_READ_SECONDS 30): reads at 0, 10, 30, 60, 90 (news),
        # 95, 96 (woken), 100 (the next slot).
        (None, 96, [10.0, 20.0, 30.0, 30.0, 5.0, 1.0, 4.0]),
        # Set to 60: reads at 0, 10, 30, 70, 130 (news), 135, 136 (woken), 140.
        (60.0, 136, [10.0, 20.0, 40.0, 60.0, 5.0, 1.0, 4.0]),
    ],
)
async def test_tap_reads_stretch_while_idle_and_return_to_the_interval_on_news(
    every: float | None, woken_at: float, expected: list[float]
) -> None:
    """Interval 5 s: reads that find nothing are twice as far apart each time, up to the
    setting; one that finds something brings the next back to 5 s; a served-revision change
    (the early event) reads at once, and the next read is at the next 5 s slot."""
    clock = asyncio.get_running_loop()
    key = ("ns", "idle")
    reads: list[float] = []
    news = {4}  # the fifth read finds new responses
    early = asyncio.Event()

    async def tap_round(key: tuple[str, str], spec: DSV4DeploymentSpec) -> bool:
        reads.append(clock.time())
        return len(reads) - 1 in news

    tuned: dict[str, Any] = {} if every is None else {"idle_reads_every": every}
    guards = GuardSupervisor(SettledReader(), Observations(), wake=lambda key: None, **tuned)
    spec = DSV4DeploymentSpec.model_validate(example_doc()["spec"])
    start = clock.time()
    loop = asyncio.create_task(guards._loop(key, spec, tap_round, Duration("5s"), early))
    try:
        await asyncio.sleep(until_slot(start, 5.0, phase(key) * 5.0) + woken_at)
        early.set()  # the served revision changed: read now
        await asyncio.sleep(5.5)
    finally:
        loop.cancel()
        await guards.close()
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(reads)]
    assert gaps == expected, gaps


@pytest.mark.looptime
async def test_a_canary_never_stretches_and_a_failed_round_counts_as_busy() -> None:
    clock = asyncio.get_running_loop()
    canary: list[float] = []
    failing: list[float] = []

    async def canary_round(key: tuple[str, str], spec: DSV4DeploymentSpec) -> bool:
        canary.append(clock.time())
        return False  # even a round that says idle: the canary keeps its interval

    async def failing_round(key: tuple[str, str], spec: DSV4DeploymentSpec) -> bool:
        failing.append(clock.time())
        raise RuntimeError("a broken round")

    guards = GuardSupervisor(SettledReader(), Observations(), wake=lambda key: None)
    spec = DSV4DeploymentSpec.model_validate(example_doc()["spec"])
    loops = [
        asyncio.create_task(
            guards._loop(("ns", "c"), spec, canary_round, Duration("10s"), idle=False)
        ),
        asyncio.create_task(guards._loop(("ns", "f"), spec, failing_round, Duration("5s"))),
    ]
    try:
        await asyncio.sleep(61)
    finally:
        for loop in loops:
            loop.cancel()
        await guards.close()
    assert {round(b - a, 3) for a, b in itertools.pairwise(canary)} == {10.0}
    assert {round(b - a, 3) for a, b in itertools.pairwise(failing)} == {5.0}


def test_a_tap_that_came_or_went_is_news() -> None:
    deltas = TrafficDeltas()
    assert deltas.retain("ns/d", {"http://a"})  # first seen
    deltas.advance(("ns/d", "http://a"), {"ok": 3})
    assert not deltas.retain("ns/d", {"http://a"})
    assert deltas.retain("ns/d", {"http://a", "http://b"})  # came
    assert deltas.retain("ns/d", set())  # went
    assert not deltas.retain("ns/d", set())


async def test_an_engine_pod_on_its_way_is_news_before_any_read() -> None:
    pending = engine_pod("r1", {})
    pending["status"] = {"phase": "Pending"}
    reader = EngineReader(pages=None)  # type: ignore[arg-type]  # no pod runs: nothing is read
    seen = await reader.round(("ns", "d"), [PodView.of(pending)], NOW)
    assert seen.pods_changed and not seen.counts and not seen.failed
    assert not (await reader.round(("ns", "d"), [], NOW)).pods_changed
    evicted = engine_pod("r1", {})
    evicted["status"] = {"phase": "Failed", "reason": "Evicted"}  # lingers: not on its way
    assert not (await reader.round(("ns", "d"), [PodView.of(evicted)], NOW)).pods_changed

"""The guard's reads of pods' pages (taps, engines) share DSV4_GUARD_READS_AT_ONCE slots, and
a read's timeout runs from when it has one."""

from __future__ import annotations

import asyncio
import copy

import pytest
from prometheus_client import REGISTRY

from dsv4_operator.guard.observations import Observations
from dsv4_operator.pods import PodView
from dsv4_operator.signals.http import BoundedPages
from dsv4_operator.signals.supervisor import GuardSupervisor
from dsv4_operator.signals.taps import TAP_SCRAPE_TIMEOUT
from tests.support.builders import NOW, SettledReader, engine_pod


class _SlowPages:
    """Pages that take `seconds` each (on the loop's clock): what overlapped, and the timeout
    each read was given."""

    def __init__(self, seconds: float, page: str = "") -> None:
        self.seconds, self.page = seconds, page
        self.in_flight = self.most = 0
        self.timeouts: list[float] = []
        self.urls: list[str] = []

    async def text(self, url: str, timeout: float) -> str:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.timeouts.append(timeout)
        self.urls.append(url)
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.in_flight -= 1
        return self.page


@pytest.mark.looptime  # the loop's clock is virtual: the waits are exact
async def test_at_most_the_bound_is_in_flight_and_each_wait_is_told() -> None:
    """Reads of 1 s, 2 at once, 6 due together: they wait 0, 0, 1, 1, 2 and 2 s, in the order
    they came, and each is given its whole timeout once it has a slot."""
    pages = _SlowPages(1.0)
    waits: list[float] = []
    held: list[float] = []
    bounded = BoundedPages(pages, 2, waits.append, held.append)
    urls = [f"http://10.0.0.{i}:9100/metrics" for i in range(6)]
    await asyncio.gather(*(bounded.text(url, 2.0) for url in urls))
    assert pages.most == 2
    assert [round(w, 3) for w in waits] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    assert [round(h, 3) for h in held] == [1.0] * 6  # the read itself, not its wait
    assert pages.urls == urls  # first come, first read
    assert pages.timeouts == [2.0] * 6  # a wait is not taken from a read's timeout


@pytest.mark.looptime
async def test_a_failed_read_gives_its_slot_back() -> None:
    class _Failing(_SlowPages):
        async def text(self, url: str, timeout: float) -> str:
            await super().text(url, timeout)
            raise ConnectionError(url)

    held: list[float] = []
    bounded = BoundedPages(_Failing(0.5), 1, lambda seconds: None, held.append)
    for _ in range(3):  # each waits for no one: the one before gave its slot back
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(bounded.text("http://10.0.0.1:9100/metrics", 2.0), 1.0)
    assert [round(h, 3) for h in held] == [0.5] * 3  # a failed read's time is told too


@pytest.mark.looptime
async def test_the_guards_engine_reads_share_the_operators_slots() -> None:
    """Three deployments' engine pods (two each), read together with one slot: one read at a
    time, each with the scrape's whole timeout, none failed for the wait, and each wait in
    dsv4_guard_read_slot_wait_seconds, each read's time in dsv4_guard_read_seconds."""
    guards = GuardSupervisor(
        SettledReader(), Observations(), wake=lambda key: None, reads_at_once=1
    )
    pages = _SlowPages(1.5)  # the last of the 12 reads waits 16.5 s, far past a 2 s timeout
    guards.clients.pods.text = pages.text  # type: ignore[method-assign]  # the pods' client
    before = REGISTRY.get_sample_value("dsv4_guard_read_slot_wait_seconds_count") or 0.0
    held_before = REGISTRY.get_sample_value("dsv4_guard_read_seconds_sum") or 0.0
    keys = [("ns", f"d{i}") for i in range(3)]

    def pods(deployment: int) -> list[PodView]:
        out = []
        for index, role in enumerate(("prefill", "decode")):
            pod = copy.deepcopy(engine_pod("r1", {}, role=role))
            pod["metadata"]["uid"] = f"uid-{deployment}-{index}"
            pod["status"] = {
                "phase": "Running",
                "podIP": f"10.0.{deployment}.{index}",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
            out.append(PodView.of(pod))
        return out

    try:
        rounds = await asyncio.gather(
            *(guards.engines.round(key, pods(i), NOW) for i, key in enumerate(keys))
        )
    finally:
        await guards.close()
    assert pages.most == 1
    assert all(not seen.failed for seen in rounds)
    # Each engine: its /metrics, then (not known yet) its /server_info, which is not JSON here.
    assert len(pages.urls) == 12
    assert set(pages.timeouts) == {TAP_SCRAPE_TIMEOUT}
    after = REGISTRY.get_sample_value("dsv4_guard_read_slot_wait_seconds_count") or 0.0
    assert after - before == 12
    # ...and each read's 1.5 s in dsv4_guard_read_seconds.
    held = (REGISTRY.get_sample_value("dsv4_guard_read_seconds_sum") or 0.0) - held_before
    assert held == pytest.approx(12 * 1.5, abs=0.01)

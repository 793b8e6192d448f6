"""The leak tap in front of an upstream stand-in (a local aiohttp app playing the router):
byte-for-byte forwarding, chunks passed on as they arrive, tool-calling exchanges
classified off the hot path, and fail-open when the classifier dies or falls behind."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from dsv4_devcluster.process import free_port, spawned_child
from dsv4_operator.leak.verdict import VerdictKind
from dsv4_operator.tap.proxy import Tap, TapConfig, metrics_app
from dsv4_operator.tap.worker import PIPE_SIZE, ClassifierLink, Worker
from tests.support.polling import exited, until

from .tap_support import TOOLS, Upstream, serve_app, stream_of

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def stack() -> AsyncIterator[tuple[Upstream, Tap, str, str, aiohttp.ClientSession]]:
    upstream = Upstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.chat)
    app.router.add_get("/other", upstream.other)
    up_runner, up_url = await serve_app(app)
    # No timed supervision: a test restarts the classifier with supervise_once().
    tap = Tap(TapConfig(upstream=up_url, deployment="d"), supervise_seconds=3600)
    await tap.start()
    host, port = await tap.listen("127.0.0.1", 0)
    session = aiohttp.ClientSession(auto_decompress=False)
    try:
        yield upstream, tap, up_url, f"http://{host}:{port}", session
    finally:
        await session.close()
        await tap.close()
        await up_runner.cleanup()


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> bytes:
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 200
        return await response.read()


async def test_responses_pass_byte_for_byte_with_status_and_headers(stack: Any) -> None:
    _, _, up_url, tap_url, session = stack
    results = []
    for url in (up_url, tap_url):
        async with session.get(f"{url}/other?q=a%20b") as response:
            results.append(
                (
                    response.status,
                    response.headers["X-Custom"],
                    response.headers.getall("Set-Cookie"),
                    await response.read(),
                )
            )
    assert results[0] == results[1]
    assert results[1][2] == ["a=1", "b=2"]  # a repeated header stays repeated
    assert gzip.decompress(results[1][3]) == b"compressed bytes pass through untouched"
    body = {"model": "m", "messages": [], "tools": TOOLS}
    assert await _post(session, up_url, body) == await _post(session, tap_url, body)


async def test_chunks_go_on_while_the_upstream_is_still_streaming(stack: Any) -> None:
    upstream, _, _, tap_url, session = stack
    upstream.hold = asyncio.Event()
    body = {"model": "m", "messages": [], "stream": True, "tools": TOOLS}
    async with session.post(f"{tap_url}/v1/chat/completions", json=body) as response:
        first = await response.content.readuntil(b"\n\n")
        # The upstream is still holding the rest: the first chunk came through on its own.
        assert first == stream_of(leak=False)[0]
        upstream.hold.set()
        rest = await response.read()
    assert first + rest == b"".join(stream_of(leak=False))


async def test_tool_calling_exchanges_are_classified_others_are_not(stack: Any) -> None:
    _, tap, _, tap_url, session = stack
    for model, stream in (("leaky", True), ("leaky", False), ("m", True), ("m", False)):
        await _post(
            session, tap_url, {"model": model, "messages": [], "tools": TOOLS, "stream": stream}
        )
    await _post(session, tap_url, {"model": "leaky", "messages": [], "stream": True})  # no tools
    async with session.post(  # the canary's own: not production traffic
        f"{tap_url}/v1/chat/completions",
        json={"model": "leaky", "messages": [], "tools": TOOLS},
        headers={"X-DSV4-Probe": "1"},
    ) as probe:
        assert probe.status == 200

    def counted() -> bool:
        counts = tap.link.counts()
        verdicts = counts.verdicts
        leaked, ok = verdicts[VerdictKind.LEAKED_MARKUP], verdicts[VerdictKind.OK]
        return bool(leaked == 2 and ok == 2 and counts.lag_buckets[-1] == 4)

    await until("four verdicts", counted)
    assert sum(tap.link.counts().verdicts.values()) == 4
    metrics_runner, metrics_url = await serve_app(metrics_app(tap))
    try:
        async with session.get(f"{metrics_url}/metrics") as response:
            text = (await response.read()).decode()
    finally:
        await metrics_runner.cleanup()
    scope = 'deployment="d",namespace="default"'  # as the page lists them
    assert f'dsv4_traffic_responses_total{{{scope},verdict="leaked_markup"}} 2.0' in text
    assert f'dsv4_traffic_requests_total{{{scope},tool_calling="false"}} 2.0' in text
    assert f"dsv4_tap_classifier_lag_seconds_count{{{scope}}} 4.0" in text


async def test_a_dead_classifier_never_holds_traffic_and_is_counted_and_restarted(
    stack: Any,
) -> None:
    _, tap, up_url, tap_url, session = stack
    pid = tap.link.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await exited("the classifier", pid)
    body = {"model": "leaky", "messages": [], "tools": TOOLS}
    expected = await _post(session, up_url, body)
    assert await _post(session, tap_url, body) == expected  # traffic goes on
    assert tap.link.dropped_down == 1
    await tap.supervise_once()
    assert tap.link.restarts == 1 and tap.link.alive()
    await _post(session, tap_url, body)
    await until(
        "a verdict after the restart",
        lambda: tap.link.counts().verdicts[VerdictKind.LEAKED_MARKUP] >= 1,
    )


async def test_a_classifier_that_falls_behind_drops_and_counts_instead_of_waiting() -> None:
    link = ClassifierLink(backlog_limit=PIPE_SIZE)
    link.start()
    try:
        await until("the classifier up", link.alive)
        assert link.pid is not None
        os.kill(link.pid, signal.SIGSTOP)  # alive, but reads nothing
        response = b"x" * (PIPE_SIZE // 4)
        accepted = [link.submit(b"{}", response) for _ in range(16)]
        # What the pipe holds (at most PIPE_SIZE) and the backlog's bound: the rest dropped.
        assert 4 <= accepted.count(True) <= 9 and accepted[-1] is False
        assert link.dropped_full == accepted.count(False)
        os.kill(link.pid, signal.SIGCONT)
        # Once it reads again, everything accepted reaches it (the backlog drains).
        await until(
            "every accepted exchange classified",
            lambda: link.counts().lag_buckets[-1] == accepted.count(True),
        )
    finally:
        await link.close()


async def test_copies_waiting_for_a_dead_classifier_are_counted_its_successor_reads_clean() -> None:
    link = ClassifierLink(backlog_limit=4 * PIPE_SIZE)
    link.start()
    try:
        await until("the classifier up", link.alive)
        assert link.pid is not None
        os.kill(link.pid, signal.SIGSTOP)
        response = b"x" * (PIPE_SIZE // 4)
        assert all(link.submit(b"{}", response) for _ in range(8))  # the pipe fills, then waits
        waiting, waiting_bytes = link.waiting
        assert waiting >= 4 and waiting_bytes > 3 * len(response)
        os.kill(link.pid, signal.SIGKILL)
        await exited("the classifier", link.pid)
        # The loop's drain meets the broken pipe: what waited is dropped and counted.
        await until("the waiting copies dropped", lambda: link.dropped_down == waiting)
        assert link.waiting == (0, 0)
        assert link.submit(b"{}", b"{}") is False and link.dropped_down == waiting + 1
        link.adopt(await asyncio.to_thread(link.spawn))
        assert link.restarts == 1
        # The new pipe starts on a frame boundary: the successor reads each copy whole.
        assert all(link.submit(b"{}", response) for _ in range(3))
        await until("three more classified", lambda: link.counts().lag_buckets[-1] == 3)
    finally:
        await link.close()


class _FailsToSpawnOnce(ClassifierLink):
    """A link whose first restart fails as when the pod is out of processes (a fault, the
    link is otherwise the real one)."""

    def __init__(self) -> None:
        super().__init__()
        self.spawns = 0

    def spawn(self) -> Worker:
        self.spawns += 1
        if self.spawns == 2:  # the first restart
            raise OSError(11, "Resource temporarily unavailable")
        return super().spawn()


async def test_a_failed_restart_is_retried_by_the_next_pass() -> None:
    link = _FailsToSpawnOnce()
    tap = Tap(TapConfig("http://127.0.0.1:9", "d"), link=link, supervise_seconds=0.05)
    await tap.start()
    try:
        first = link.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await until("restarted after a failed try", lambda: link.restarts == 1 and link.alive())
        assert link.spawns == 3 and link.pid != first
    finally:
        await tap.close()


async def test_the_classifier_ends_with_the_tap_that_fed_it() -> None:
    """SIGKILL leaves no time for clean-up: the classifier ends because its pipe does."""
    metrics = f"127.0.0.1:{free_port()}"
    tap = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dsv4_operator.cli", "tap", "--upstream", "http://127.0.0.1:9",
        "--listen", "127.0.0.1:0", "--metrics", metrics, "--deployment", "d",
    )  # fmt: skip
    try:
        await until("the classifier started", lambda: spawned_child(tap.pid) is not None)
        classifier = spawned_child(tap.pid)
        assert classifier is not None
    finally:
        tap.kill()
        await tap.wait()
    await exited("the classifier", classifier)


async def test_a_late_timer_shows_in_the_loop_lag() -> None:
    """The watch's clock is the test's: it jumps 0.2 s while the watch sleeps, as the clock
    does while a busy loop holds a timer back."""
    clock = _Clock()
    tap = Tap(TapConfig("http://127.0.0.1:9", "d"), supervise_seconds=3600, clock=clock)
    await tap.start()
    try:
        registry = tap.metrics.registry

        def lag(bound: str) -> float:
            sample = registry.get_sample_value(
                "dsv4_tap_event_loop_lag_seconds_bucket",
                {"namespace": "default", "deployment": "d", "le": bound},
            )
            return sample or 0.0

        await until("the watch's first look", lambda: lag("+Inf") >= 1)
        assert lag("0.002") == lag("+Inf")  # on time while the clock stood still
        clock.now += 0.2  # the timer armed 50 ms ahead now runs 150 ms late
        await until("the late timer observed", lambda: lag("+Inf") > lag("0.1"))
        assert lag("0.25") == lag("+Inf")  # 0.15 s, not more
    finally:
        await tap.close()


class _Clock:
    """A monotonic clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_copies_close_together_go_in_one_write_and_close_flushes_them() -> None:
    """Under load the link writes the copies of a burst together (one system call, one wake-up
    of the classifier): the first after a quiet spell goes at once, those that follow wait for
    the flush; closing the link writes what still waits, so nothing accepted is lost."""
    link = ClassifierLink(flush_seconds=3600)  # no timed flush during the test
    link.start()
    try:
        await until("the classifier up", link.alive)
        assert link.submit(b"{}", b"first") and link.waiting == (0, 0)
        assert link.submit(b"{}", b"second") and link.submit(b"{}", b"third")
        copies, waiting_bytes = link.waiting
        assert copies == 2 and waiting_bytes > len(b"secondthird")
    finally:
        await link.close()  # the worker has read everything once it has ended
    assert link.counts().lag_buckets[-1] == 3 and link.dropped_full == link.dropped_down == 0

"""`dsv4 tap --workers N`: worker processes relaying on one port (SO_REUSEPORT), a parent that
restarts a dead one and serves their /metrics summed, counters that never go down."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner

from dsv4_devcluster.process import free_port, spawned_children
from dsv4_operator.cli import main
from dsv4_operator.guard.taps import parse_counts
from dsv4_operator.tap.proxy import TapConfig
from dsv4_operator.tap.workers import WorkerPool
from tests.support.polling import exited

from .tap_support import TOOLS, TapProcess, Upstream, running_tap, serve_app

pytestmark = pytest.mark.asyncio

CONNECTIONS = 24  # each on its own connection: the kernel spreads them over the workers


@pytest.fixture
async def tap() -> AsyncIterator[TapProcess]:
    upstream = Upstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.chat)
    runner, up_url = await serve_app(app)
    try:
        async with running_tap(up_url, workers=2) as tap:
            yield tap
    finally:
        await runner.cleanup()


async def _exchanges(url: str, count: int) -> None:
    """`count` streamed tool-calling requests, each on a new connection; half of the
    responses leak DSML markup (the stand-in's `leaky` model)."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(count):
            body: dict[str, Any] = {
                "model": "leaky" if i % 2 else "m",
                "stream": True,
                "messages": [{"role": "user", "content": "weather?"}],
                "tools": TOOLS,
            }
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                assert (await response.read()).endswith(b"data: [DONE]\n\n")


async def test_workers_relay_on_one_port_and_their_counts_add_up(tap: TapProcess) -> None:
    workers = spawned_children(tap.process.pid)
    assert len(workers) == 2, workers
    await _exchanges(tap.url, CONNECTIONS)
    half = CONNECTIONS // 2
    await tap.settled("dsv4_traffic_responses_total", half, verdict="leaked_markup")
    await tap.settled("dsv4_traffic_responses_total", half, verdict="ok")
    assert await tap.value("dsv4_traffic_requests_total", tool_calling="true") == CONNECTIONS
    assert await tap.value("dsv4_tap_added_latency_seconds_count", phase="request") >= CONNECTIONS
    assert await tap.value("dsv4_tap_worker_restarts_total") == 0
    # What the guard reads from it: the verdicts of both workers' responses, summed.
    counts = parse_counts(await tap.text())
    assert {verdict: n for verdict, n in counts.items() if n} == {
        "ok": half,
        "leaked_markup": half,
    }


async def test_a_dead_worker_is_restarted_and_its_counts_stay(tap: TapProcess) -> None:
    await _exchanges(tap.url, CONNECTIONS)
    await tap.settled("dsv4_traffic_responses_total", CONNECTIONS)  # read from both workers
    before = await tap.metrics()
    victim = spawned_children(tap.process.pid)[0]
    os.kill(victim, signal.SIGKILL)
    await exited("the killed worker", victim)
    await tap.settled("dsv4_tap_worker_restarts_total", 1)
    await tap.settled("dsv4_tap_workers", 2)
    assert victim not in spawned_children(tap.process.pid)
    after = await tap.metrics()
    # Each worker took some of the 24 connections (the kernel hashes each to one): the dead
    # one's counts stay in the sums, so no counter went down.
    counters = [key for key in before if key[0].endswith(("_total", "_count", "_bucket"))]
    assert counters
    went_down = {
        key: (before[key], after.get(key)) for key in counters if after.get(key, 0) < before[key]
    }
    assert not went_down, went_down
    await _exchanges(tap.url, CONNECTIONS)  # both workers serve again
    await tap.settled("dsv4_traffic_responses_total", 2 * CONNECTIONS)


async def test_sigterm_stops_the_workers_and_their_classifiers(tap: TapProcess) -> None:
    workers = spawned_children(tap.process.pid)
    classifiers = [child for worker in workers for child in spawned_children(worker)]
    assert len(classifiers) == 2, classifiers
    tap.process.terminate()
    assert await tap.process.wait() == 0
    for pid in workers + classifiers:
        await exited(f"process {pid}", pid)


async def test_a_worker_that_cannot_listen_fails_the_tap_with_its_error() -> None:
    """Another process on the port without SO_REUSEPORT: the workers cannot bind; the tap
    exits saying so instead of restarting them forever."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dsv4_operator.cli", "tap", "--upstream", "http://127.0.0.1:9",
            "--listen", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{free_port()}",
            "--deployment", "d", "--workers", "2",
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 2
    assert b"--workers 2: tap worker 0: OSError" in stderr, stderr
    assert b"address already in use" in stderr.lower(), stderr


async def _pool_reading(
    text: str, tmp_path: Path, during: Callable[[WorkerPool], None] = lambda pool: None
) -> WorkerPool:
    """A pool of one slot, read once; its worker is played by an app on the slot's socket that
    answers /metrics with `text`, calling `during(pool)` before it answers."""
    pool = WorkerPool(TapConfig("http://127.0.0.1:9", "d"), ("127.0.0.1", 0), 1, tmp_path)
    await _read_again(pool, text, during)
    return pool


async def _read_again(
    pool: WorkerPool, text: str, during: Callable[[WorkerPool], None] = lambda pool: None
) -> None:
    """One read of the pool's slot from a worker played by an app on its socket."""

    async def metrics(request: web.Request) -> web.Response:
        during(pool)
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, pool.slots[0].socket_path).start()
    try:
        await pool.read(pool.slots[0])
    finally:
        await runner.cleanup()


WORKER_TEXT = """# HELP dsv4_traffic_requests_total Requests.
# TYPE dsv4_traffic_requests_total counter
dsv4_traffic_requests_total{deployment="d",tool_calling="true"} 3.0
# HELP dsv4_traffic_requests_created Requests.
# TYPE dsv4_traffic_requests_created gauge
dsv4_traffic_requests_created{deployment="d",tool_calling="true"} 1.7e+09
# HELP dsv4_tap_classifier_backlog_bytes Bytes waiting.
# TYPE dsv4_tap_classifier_backlog_bytes gauge
dsv4_tap_classifier_backlog_bytes{deployment="d"} 100.0
# HELP dsv4_tap_added_latency_seconds Added.
# TYPE dsv4_tap_added_latency_seconds histogram
dsv4_tap_added_latency_seconds_bucket{deployment="d",le="0.001"} 1.0
dsv4_tap_added_latency_seconds_bucket{deployment="d",le="0.01"} 2.0
dsv4_tap_added_latency_seconds_bucket{deployment="d",le="+Inf"} 2.0
dsv4_tap_added_latency_seconds_count{deployment="d"} 2.0
dsv4_tap_added_latency_seconds_sum{deployment="d"} 0.005
"""


async def test_the_sums_keep_a_retired_workers_counters_not_its_gauges(tmp_path: Path) -> None:
    pool = await _pool_reading(WORKER_TEXT, tmp_path)
    pool.slots[0].retire()  # the worker died, its successor counted the same since
    await _read_again(pool, WORKER_TEXT)
    summed = {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for metric in pool.summed()
        for sample in metric.samples
    }
    assert summed["dsv4_traffic_requests_total[('deployment', 'd'), ('tool_calling', 'true')]"] == 6
    assert summed["dsv4_tap_classifier_backlog_bytes[('deployment', 'd')]"] == 100
    assert summed["dsv4_tap_added_latency_seconds_count[('deployment', 'd')]"] == 4
    assert not any("_created" in key for key in summed)
    buckets = [
        sample.labels["le"]
        for metric in pool.summed()
        for sample in metric.samples
        if sample.name.endswith("_bucket")
    ]
    assert buckets == ["0.001", "0.01", "+Inf"]  # in the workers' order, as Prometheus wants


async def test_a_read_that_ends_after_its_worker_was_retired_is_dropped(tmp_path: Path) -> None:
    """The supervisor moved the worker's counts to `retired` while its reply was on the way:
    taking the reply too would count them twice."""

    def retire(pool: WorkerPool) -> None:
        pool.slots[0].retire()

    assert (await _pool_reading(WORKER_TEXT, tmp_path)).slots[0].last
    assert (await _pool_reading(WORKER_TEXT, tmp_path, retire)).slots[0].last == {}


async def test_workers_need_a_port_named() -> None:
    args = ["tap", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"]
    result = CliRunner().invoke(main, [*args, "--deployment", "d", "--workers", "2"])
    assert result.exit_code == 2
    assert "--listen: a port of 0 would give each worker a port of its own" in result.output

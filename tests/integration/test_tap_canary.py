"""The real `dsv4 tap` runs the operator's canary against the router behind it (POST /canary,
canary/remote.py): here an engine double stands in for the router; the double says what it
is (/server_info `engine_double`). The operator's side, asking the taps of a fleet, runs in
tests/integration/test_scale_bench.py."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import aiohttp
import httpx
import pytest

from dsv4_engine_double.process import DoubleProcess
from dsv4_operator.canary.remote import RunCounts, RunRequest, run_on_tap
from dsv4_operator.leak.verdict import LEAK_KINDS, VerdictKind
from dsv4_operator.signals.http import AiohttpExchanges

from .tap_support import running_tap

pytestmark = pytest.mark.asyncio

MODEL = "dsv4"
ARGV = ["--served-model-name", MODEL, "--enable-metrics", "--disaggregation-mode", "decode"]


def _served(double: DoubleProcess) -> int:
    info = httpx.get(f"{double.url}/server_info", timeout=5).json()
    assert info["engine_double"] is True
    return int(info["internal_states"][0]["chat_requests"])


def _base(tap_metrics_url: str) -> str:
    return tap_metrics_url.removesuffix("/metrics")


async def _ask(tap_url: str, request: RunRequest) -> RunCounts:
    client = AiohttpExchanges(ssl.create_default_context(), keep=False)
    try:
        return await run_on_tap(client, tap_url, request)
    finally:
        await client.aclose()


async def _post(url: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as reply:
        text = await reply.text()
        return reply.status, json.loads(text) if reply.content_type == "application/json" else text


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_tap_runs_the_canary_against_its_router_and_answers_the_counts(
    workers: int,
) -> None:
    """The first 4 requests the double serves are corrupted: the first run's 4 sessions each
    leak in round 1 (a session ends at its first bad response); the second run is clean, all
    its 4 x 2 rounds. Every request reached the router from the tap."""
    env = {"DSV4_DOUBLE_LEAK_FIRST": "4", "DSV4_DOUBLE_LEAK_RATE": "1.0"}
    with DoubleProcess(ARGV, env) as double:
        async with running_tap(double.url, workers) as tap:
            asked = RunRequest(model=MODEL, sessions=4, rounds=2)
            first = await _ask(_base(tap.metrics_url), asked)
            assert sum(first.counts.get(k, 0) for k in LEAK_KINDS) == 4, first
            assert sum(first.counts.values()) == 4 and first.first_error is None
            second = await _ask(_base(tap.metrics_url), asked)
            assert {k: v for k, v in second.counts.items() if v} == {VerdictKind.OK: 8}
            assert await asyncio.to_thread(_served, double) == 4 + 8
            # Not relayed: the tap's traffic counts are the users', not its own canary's.
            assert await tap.value("dsv4_traffic_requests_total") == 0


async def test_a_tap_runs_at_most_its_bound_and_names_a_bad_field() -> None:
    env = {"DSV4_DOUBLE_LATENCY_MS": "3000"}  # a run holds the tap's one slot ~3 s
    with DoubleProcess(ARGV, env) as double:
        async with running_tap(double.url) as tap:
            url = _base(tap.metrics_url) + "/canary"
            slow = asyncio.create_task(_post(url, {"model": MODEL, "sessions": 1, "rounds": 1}))
            while await asyncio.to_thread(_served, double) < 1:  # the run has begun
                await asyncio.sleep(0.05)
            busy, said = await _post(url, {"model": MODEL, "sessions": 1, "rounds": 1})
            assert busy == 429 and "in progress" in said["error"]
            status, counts = await slow
            assert status == 200 and counts["counts"]["ok"] == 1 and counts["firstError"] is None
            bad, said = await _post(url, {"model": MODEL, "sessions": 65, "rounds": 1})
            assert bad == 400 and said["error"].startswith("sessions:"), said


async def test_a_tap_told_to_run_no_canary_has_no_canary_to_run() -> None:
    with DoubleProcess(ARGV, {}) as double:
        async with running_tap(double.url, 1, "--canary-runs-at-once", "0") as tap:
            status, _ = await _post(_base(tap.metrics_url) + "/canary", {})
            assert status == 404
            assert await asyncio.to_thread(_served, double) == 0

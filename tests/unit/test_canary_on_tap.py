"""Where the canary runs: a router pod's tap when the spec probes the router and the pods carry
a tap (one request of the operator's per run), else, or when that tap does not run it, the
operator; and the wire format both sides share (canary/remote.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import make_mocked_request
from prometheus_client import REGISTRY

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.canary.remote import (
    CanaryService,
    RunCounts,
    RunRequest,
    TapCanaryTimedOut,
    TapCanaryUnavailable,
    run_on_tap,
)
from dsv4_operator.guard.observations import Observations
from dsv4_operator.signals.canary_runner import CanaryRun, runs_on_tap
from dsv4_operator.signals.supervisor import GuardSupervisor
from tests.support.builders import example_doc

KEY = ("ns", "d")


def _router_pod(ip: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": f"d-router-{ip}", "labels": {"dsv4.io/role": "router"}},
        "status": {"phase": phase, "podIP": ip},
    }


class _Reader:
    """A settled deployment whose router pods are `pods`."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    async def get(self, res: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        return {"status": {"phase": "Ready", "currentRevision": "abc"}}

    async def list(self, res: Any, namespace: str | None, labels: Any = None) -> list[Any]:
        return self.pods if res.kind == "Pod" else []

    async def serves(self, res: Any) -> bool:
        return True


def _spec(**guard: Any) -> DSV4DeploymentSpec:
    doc = example_doc()["spec"]
    doc["guard"] = {**doc.get("guard", {}), **guard}
    return DSV4DeploymentSpec.model_validate(doc)


def _runs(runner: str) -> float:
    labels = {"namespace": KEY[0], "deployment": KEY[1], "runner": runner}
    return REGISTRY.get_sample_value("dsv4_canary_runs_total", labels) or 0.0


async def _one_round(
    pods: list[dict[str, Any]], spec: DSV4DeploymentSpec, tap_fails: Exception | None = None
) -> tuple[list[str], list[str], Observations]:
    """One canary round; (the endpoints the operator probed, the taps asked, observations)."""
    here: list[str] = []
    taps: list[str] = []

    async def runner(endpoint: str, model: str, spec: DSV4DeploymentSpec) -> CanaryRun:
        here.append(endpoint)
        return CanaryRun({"clean": 4})

    async def tap_runner(tap: str, model: str, spec: DSV4DeploymentSpec) -> CanaryRun:
        taps.append(tap)
        if tap_fails is not None:
            raise tap_fails
        return CanaryRun({"clean": 3, "leaked_markup": 1})

    guards = GuardSupervisor(
        _Reader(pods), Observations(), wake=lambda key: None, runner=runner, tap_runner=tap_runner
    )
    try:
        await guards._round(KEY, spec)
    finally:
        await guards.close()
    return here, taps, guards.observations


async def test_the_default_canary_is_run_by_a_router_pods_tap() -> None:
    before = _runs("tap"), _runs("operator")
    pods = [_router_pod("10.0.0.7"), _router_pod("10.0.0.8", phase="Pending")]
    here, taps, observed = await _one_round(pods, _spec())
    assert here == []
    assert taps == ["http://10.0.0.7:9100"]  # the running pod's tap, never the pending one
    window = observed.snapshot(KEY)
    assert window is not None and (window.samples, window.leaks) == (4, 1)  # the tap's counts
    assert (_runs("tap") - before[0], _runs("operator") - before[1]) == (1, 0)


async def test_a_tap_that_does_not_run_it_leaves_the_run_to_the_operator(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = _runs("operator")
    here, taps, observed = await _one_round(
        [_router_pod("10.0.0.7")], _spec(), tap_fails=TapCanaryUnavailable("HTTP 404")
    )
    assert taps == ["http://10.0.0.7:9100"]
    assert here == ["http://d-router.ns.svc:8000"]  # the router Service, as without a tap
    window = observed.snapshot(KEY)
    assert window is not None and (window.samples, window.leaks) == (4, 0)
    assert _runs("operator") - before == 1
    assert "did not run the canary (HTTP 404)" in caplog.text


async def test_a_run_the_tap_took_and_did_not_answer_is_a_failed_run_not_run_again() -> None:
    before = _runs("tap"), _runs("operator")
    here, taps, observed = await _one_round(
        [_router_pod("10.0.0.7")], _spec(), tap_fails=TapCanaryTimedOut("no answer within 270 s")
    )
    assert taps == ["http://10.0.0.7:9100"] and here == []  # not repeated by the operator
    window = observed.snapshot(KEY)
    assert window is not None and window.samples == 0
    assert window.consecutive_errors == 1  # counts toward errorLimit (GuardBlind)
    assert window.failing_causes == "canary run by a router pod's tap: no answer within 270 s"
    assert (_runs("tap") - before[0], _runs("operator") - before[1]) == (0, 0)


@pytest.mark.parametrize(
    ("guard", "why"),
    [
        ({"canary": {"endpoint": "http://probe.example:8000"}}, "the spec names the endpoint"),
        ({"tap": {"enabled": False}}, "no tap in the router pods"),
        ({"tap": {"metricsEndpoints": ["http://tap.example:9100/metrics"]}}, "taps elsewhere"),
    ],
)
async def test_the_operator_runs_the_canary_when_no_router_pod_tap_can(
    guard: dict[str, Any], why: str
) -> None:
    spec = _spec(**guard)
    assert not runs_on_tap(spec), why
    here, taps, _ = await _one_round([_router_pod("10.0.0.7")], spec)
    assert taps == [] and len(here) == 1, why


async def test_without_a_running_router_pod_the_operator_runs_it() -> None:
    here, taps, _ = await _one_round([_router_pod("10.0.0.7", phase="Pending")], _spec())
    assert taps == [] and here == ["http://d-router.ns.svc:8000"]


# --- the wire ---------------------------------------------------------------------------------


def test_a_run_request_is_bounded_as_the_spec_is() -> None:
    assert RunRequest(model="m", sessions=64, rounds=16).timeout() == 16 * 60 + 30
    for bad in ({"sessions": 0}, {"sessions": 65}, {"rounds": 17}, {"model": ""}, {"x": 1}):
        with pytest.raises(ValueError):
            RunRequest.model_validate({"model": "m", "sessions": 9, "rounds": 4, **bad})


def test_run_counts_round_trip_and_refuse_what_is_not_theirs() -> None:
    counts = RunCounts({"clean": 30, "error": 6}, "HTTP 503")
    assert RunCounts.from_wire(json.loads(json.dumps(counts.to_wire()))) == counts
    bad_wires: list[Any] = [
        [],
        {"counts": []},
        {"counts": {"clean": -1}},
        {"counts": {"clean": 1.5}},
        {"counts": {"clean": 1}, "firstError": 3},
    ]
    for bad in bad_wires:
        with pytest.raises(ValueError):
            RunCounts.from_wire(bad)


class _Poster:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body
        self.asked: list[tuple[str, bytes | None, float, float | None]] = []

    async def exchange(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
        *,
        connect: float | None = None,
    ) -> tuple[int, bytes]:
        self.asked.append((url, body, timeout, connect))
        return self.status, self.body


async def test_asking_a_tap_waits_for_the_run_but_connects_in_seconds() -> None:
    poster = _Poster(200, b'{"counts": {"clean": 36}, "firstError": null}')
    asked = RunRequest(model="dsv4", sessions=9, rounds=4)
    assert await run_on_tap(poster, "http://10.0.0.7:9100", asked) == RunCounts({"clean": 36})
    url, body, timeout, connect = poster.asked[0]
    assert url == "http://10.0.0.7:9100/canary"
    assert json.loads(body or b"") == {"model": "dsv4", "sessions": 9, "rounds": 4}
    assert (timeout, connect) == (4 * 60 + 30, 2.0)


@pytest.mark.parametrize(
    ("status", "body", "why"),
    [
        (404, b"Not Found", "HTTP 404"),
        (429, b"{}", "HTTP 429"),
        (200, b"<html>", "not a canary run's counts"),
        (200, b'{"counts": "all good"}', "not a canary run's counts"),
    ],
)
async def test_a_tap_that_did_not_run_it_says_so(status: int, body: bytes, why: str) -> None:
    with pytest.raises(TapCanaryUnavailable, match=why):
        await run_on_tap(
            _Poster(status, body), "http://t:9100", RunRequest(model="m", sessions=1, rounds=1)
        )


class _Raising:
    """A client that fails as the transport would."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def exchange(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        raise self.error


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (httpx.ConnectTimeout("connect"), TapCanaryUnavailable),  # never asked: run it here
        (httpx.ConnectError("refused"), TapCanaryUnavailable),
        (httpx.ReadError("reset"), TapCanaryUnavailable),  # the tap went away mid-run
        (httpx.ReadTimeout("no byte for the run's time"), TapCanaryTimedOut),
        (TimeoutError(), TapCanaryTimedOut),
    ],
)
async def test_only_a_run_the_tap_took_and_never_answered_is_timed_out(
    error: Exception, raised: type[Exception]
) -> None:
    with pytest.raises(raised):
        await run_on_tap(
            _Raising(error), "http://t:9100", RunRequest(model="m", sessions=1, rounds=1)
        )


class _Service(CanaryService):
    """The tap's handler with the run itself stood in for (the harness has its own tests)."""

    def __init__(self, at_once: int) -> None:
        super().__init__("http://127.0.0.1:8000", client=None, at_once=at_once)  # type: ignore[arg-type]
        self.asked: list[RunRequest] = []

    async def run(self, asked: RunRequest) -> RunCounts:
        self.asked.append(asked)
        return RunCounts({"clean": asked.sessions * asked.rounds})


def _post(body: bytes) -> Any:
    request = make_mocked_request("POST", "/canary", headers={"Content-Type": "application/json"})
    request._read_bytes = body  # what `await request.read()` returns
    return request


async def test_the_tap_runs_what_it_is_asked_and_names_a_bad_field() -> None:
    service = _Service(at_once=1)
    ok = await service.handle(_post(b'{"model": "m", "sessions": 2, "rounds": 3}'))
    assert ok.status == 200 and ok.text is not None
    assert json.loads(ok.text) == {"counts": {"clean": 6}, "firstError": None}
    bad = await service.handle(_post(b'{"model": "m", "sessions": 99, "rounds": 3}'))
    assert (
        bad.status == 400 and bad.text is not None and "sessions" in json.loads(bad.text)["error"]
    )
    assert (await service.handle(_post(b"not json"))).status == 400
    assert len(service.asked) == 1


async def test_the_tap_refuses_a_run_beyond_its_bound() -> None:
    service = _Service(at_once=1)
    service.running = 1  # a run in progress
    busy = await service.handle(_post(b'{"model": "m", "sessions": 2, "rounds": 3}'))
    assert busy.status == 429 and service.asked == []

"""The canary harness and `dsv4 probe`, against engine doubles on 127.0.0.1.

The doubles here run at a DECLARED load (`DSV4_DOUBLE_LOAD`, or the `X-DSV4-Double-Load`
header a client sends): their verdicts depend on the seed, the conversation and that number
only, never on how many requests really overlap, so every count below is the same on an idle
machine and a saturated one. Expected leak counts come from the double's curve
(testsupport/dsv4_engine_double/expectations.py), not from what one seed happens to give.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from dsv4_devcluster.process import free_port
from dsv4_engine_double.config import LOAD_HEADER, corruption_probability, parse_config
from dsv4_engine_double.expectations import leak_band
from dsv4_engine_double.process import DoubleProcess
from dsv4_operator.canary.harness import run_canary
from dsv4_operator.canary.report import CanaryReport
from dsv4_operator.canary.scenario import fake_result, first_messages, session_steps
from dsv4_operator.canary.transport import (
    MAX_ATTEMPTS,
    EndpointUnreachable,
    Exchanges,
    HttpxExchanges,
    discover_model,
)
from dsv4_operator.cli import main
from dsv4_operator.leak.verdict import LEAK_KINDS, VerdictKind
from dsv4_operator.signals.http import AiohttpExchanges, GuardHttp
from tests.support.contract import assert_contract
from tests.support.proxies import clear_proxies

# The operator's rendered engine argv (decode role) for the example and its bf16 variant.
ENGINE_ARGS = [
    "--model-path", "deepseek-ai/DeepSeek-V4-Flash", "--served-model-name", "deepseek-v4-flash",
    "--tp-size", "4", "--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
    "mooncake", "--disaggregation-bootstrap-port", "8998", "--kv-cache-dtype", "fp8_e4m3",
    "--mem-fraction-static", "0.85", "--max-running-requests", "64", "--cuda-graph-max-bs", "64",
    "--context-length", "131072", "--max-total-tokens", "6014720", "--tool-call-parser",
    "deepseekv4", "--reasoning-parser", "deepseek-v4", "--enable-metrics",
    "--disable-overlap-schedule",
]  # fmt: skip
HICACHE_ARGS = ["--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-write-policy",
                "write_through"]  # fmt: skip
CAPS = {"DSV4_DOUBLE_CAPABILITIES": "bf16IndexK,poolSizingFix"}
FP8_ENV = {**CAPS, "SGLANG_DSV4_BF16_INDEX_K": "0", "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": "0"}
BF16_ENV = {**CAPS, "SGLANG_DSV4_BF16_INDEX_K": "1", "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": "0"}
MODEL = "deepseek-v4-flash"
# The incident's concurrency ("0% at C=1, 12-18% of 4-round sessions at C>=60"), declared to the
# double instead of produced by real overlap. Latency no longer matters to the verdicts: short.
DECLARED_LOAD = 60
LOADED = {"DSV4_DOUBLE_LOAD": str(DECLARED_LOAD), "DSV4_DOUBLE_LATENCY_MS": "20"}
FP8_CONFIG = parse_config([*ENGINE_ARGS, *HICACHE_ARGS], {**FP8_ENV, **LOADED})
BF16_HICACHE_CONFIG = parse_config([*ENGINE_ARGS, *HICACHE_ARGS], {**BF16_ENV, **LOADED})


@pytest.fixture(scope="module")
def fp8() -> Iterator[str]:
    """The incident's proven-safe config: fp8 index-K, HiCache on (it is safe with fp8)."""
    with DoubleProcess([*ENGINE_ARGS, *HICACHE_ARGS], {**FP8_ENV, **LOADED}) as double:
        yield double.url


@pytest.fixture(scope="module")
def bf16_hicache() -> Iterator[str]:
    """The incident's corrupting config: bf16 index-K + HiCache on an image without the gate."""
    with DoubleProcess([*ENGINE_ARGS, *HICACHE_ARGS], {**BF16_ENV, **LOADED}) as double:
        yield double.url


@contextlib.asynccontextmanager
async def guard_canary() -> AsyncIterator[Exchanges]:
    """The guard's canary exchanges (aiohttp directly: no proxy in the environment)."""
    http = GuardHttp.create()
    assert isinstance(http.canary, AiohttpExchanges)
    try:
        yield http.canary
    finally:
        await http.close()


# The canary's transport semantics hold for both clients it runs with: httpx's own (the CLI,
# `dsv4 probe`) and the guard's (aiohttp's connections, signals/http.py).
ClientFactory = Callable[[], AbstractAsyncContextManager[httpx.AsyncClient | Exchanges]]
CLIENTS: dict[str, ClientFactory] = {
    "httpx": lambda: httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0)),
    "guard": guard_canary,
}


@pytest.fixture(params=sorted(CLIENTS))
def new_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ClientFactory:
    clear_proxies(monkeypatch)  # else the guard's client is httpx's own transport
    return CLIENTS[request.param]


def limited_client(load: int | None = None) -> httpx.AsyncClient:
    """A client for 60-session canaries; `load` declares the double's load per request."""
    headers = {LOAD_HEADER: str(load)} if load is not None else None
    limits = httpx.Limits(max_connections=70, max_keepalive_connections=8)
    return httpx.AsyncClient(limits=limits, headers=headers)


def assert_follows_the_curve(report: CanaryReport, load: int = DECLARED_LOAD) -> None:
    """bf16 + HiCache: session leaks within the band the curve allows at `load`."""
    low, high = leak_band(BF16_HICACHE_CONFIG, load, report.sessions, report.rounds)
    assert report.errors == 0 and report.sessions_observed == report.sessions
    assert low <= report.session_leaks <= high, (load, report.session_leaks, (low, high))


def leaked(report: CanaryReport) -> set[int]:
    return {s.index for s in report.session_results if s.leaked}


def verdicts(report: CanaryReport) -> list[tuple[VerdictKind, ...]]:
    return [s.verdicts for s in sorted(report.session_results, key=lambda s: s.index)]


def check_consistency(report: CanaryReport) -> None:
    assert sum(report.counts.values()) == report.responses == len(report.records)
    assert report.leaks == sum(report.counts[k] for k in LEAK_KINDS)
    assert len(report.session_results) == report.sessions
    for session in report.session_results:
        # A session stops at its first non-ok round, and only then.
        assert all(v is VerdictKind.OK for v in session.verdicts[:-1])
        assert len(session.verdicts) == report.rounds or session.verdicts[-1] is not VerdictKind.OK
    p50, p95, p99 = report.latency_p50, report.latency_p95, report.latency_p99
    if report.classified:
        assert p50 is not None and p95 is not None and p99 is not None
        assert 0 < p50 <= p95 <= p99


async def test_fp8_has_no_leak(fp8: str) -> None:
    assert leak_band(FP8_CONFIG, DECLARED_LOAD, 20, 3) == (0, 0)  # fp8 never corrupts
    async with limited_client() as client:
        report = await run_canary(client, fp8, MODEL, sessions=20, rounds=3, seed=1)
    check_consistency(report)
    assert report.counts[VerdictKind.OK] == report.responses == 60
    assert report.leaks == 0 and report.session_leaks == 0
    assert report.sessions_observed == 20
    assert all(s.outcome == "clean" for s in report.session_results)
    assert report.leak_interval[0] == 0.0
    assert report.examples == []


async def test_bf16_hicache_corrupts_about_a_sixth_of_sessions_at_60(bf16_hicache: str) -> None:
    async with limited_client() as client:
        report = await run_canary(client, bf16_hicache, MODEL, sessions=60, rounds=4)
    check_consistency(report)
    assert_follows_the_curve(report)
    assert report.session_leaks > 0  # the band's lower end is above 0 at 60 x 4
    assert report.session_leaks == sum(1 for s in report.session_results if s.leaked)
    low, high = report.session_leak_interval
    assert low <= report.session_leak_rate <= high and low > 0.02
    examples = report.examples
    assert 0 < len(examples) <= 5
    assert all(e.verdict.leak and e.verdict.snippet for e in examples)
    kinds = {r.verdict.kind for r in report.records if r.verdict.leak}
    assert {e.verdict.kind for e in examples[: len(kinds)]} == kinds  # one of each kind first


@pytest.mark.parametrize("load", [1, 4])
async def test_bf16_hicache_is_clean_at_a_light_declared_load(bf16_hicache: str, load: int) -> None:
    # The curve is exactly 0 up to 4 (the incident: 0% at C=1), so not one of 240 responses may
    # leak, even though all 60 sessions are really in flight together.
    assert corruption_probability(BF16_HICACHE_CONFIG, load) == 0.0
    async with limited_client(load) as client:
        report = await run_canary(client, bf16_hicache, MODEL, sessions=60, rounds=4)
    check_consistency(report)
    assert report.responses == 240 and report.leaks == 0 and report.errors == 0


async def test_verdicts_follow_the_declared_load_not_the_overlap(bf16_hicache: str) -> None:
    # 60 sessions all in flight vs one request at a time: the server sees overlap 60 vs 1, yet
    # every session gets the same verdicts, because the declared load (60) is what counts.
    async with limited_client() as client:
        together = await run_canary(client, bf16_hicache, MODEL, sessions=60, rounds=4, seed=5)
        one_by_one = await run_canary(
            client, bf16_hicache, MODEL, sessions=60, rounds=4, seed=5, concurrency=1
        )
        again = await run_canary(client, bf16_hicache, MODEL, sessions=60, rounds=4, seed=5)
    assert_follows_the_curve(together)
    assert verdicts(together) == verdicts(one_by_one) == verdicts(again)
    assert together.counts == one_by_one.counts == again.counts


async def test_a_lower_declared_load_leaks_in_a_subset_of_the_sessions(bf16_hicache: str) -> None:
    # One uniform draw per response is compared with the curve, and the curve never decreases:
    # a session that leaks at load 24 (header) also leaks at 60 (the double's env).
    low_load = 24
    assert (
        0
        < corruption_probability(BF16_HICACHE_CONFIG, low_load)
        < corruption_probability(BF16_HICACHE_CONFIG, DECLARED_LOAD)
    )
    async with limited_client() as client:
        high = await run_canary(client, bf16_hicache, MODEL, sessions=60, rounds=4, seed=2)
    async with limited_client(low_load) as client:
        low = await run_canary(client, bf16_hicache, MODEL, sessions=60, rounds=4, seed=2)
    assert_follows_the_curve(high)
    assert_follows_the_curve(low, low_load)
    assert leaked(low) <= leaked(high)


async def test_streaming(fp8: str, bf16_hicache: str) -> None:
    async with limited_client() as client:
        clean = await run_canary(client, fp8, MODEL, sessions=10, rounds=3, stream=True)
        dirty = await run_canary(client, bf16_hicache, MODEL, sessions=60, rounds=4, stream=True)
        plain = await run_canary(client, bf16_hicache, MODEL, sessions=60, rounds=4)
    check_consistency(clean)
    check_consistency(dirty)
    assert clean.counts[VerdictKind.OK] == 30
    assert_follows_the_curve(dirty)
    # Streaming changes the transport, not the conversation: the same verdicts as plain JSON.
    assert verdicts(dirty) == verdicts(plain)


async def test_the_guards_exchanges_give_httpxs_verdicts(
    bf16_hicache: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same conversations through the guard's aiohttp exchanges and through httpx: the
    # same verdicts, streamed and plain (the double's verdicts depend on the seed alone).
    clear_proxies(monkeypatch)
    runs = {}
    for stream in (False, True):
        async with limited_client() as client:
            runs["httpx", stream] = await run_canary(
                client, bf16_hicache, MODEL, sessions=60, rounds=4, seed=9, stream=stream
            )
        async with guard_canary() as exchanges:
            runs["guard", stream] = await run_canary(
                exchanges, bf16_hicache, MODEL, sessions=60, rounds=4, seed=9, stream=stream
            )
    for report in runs.values():
        check_consistency(report)
        assert_follows_the_curve(report)
    assert len({tuple(verdicts(r)) for r in runs.values()}) == 1


async def test_with_a_proxy_in_the_environment_the_canary_keeps_httpxs_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clear_proxies(monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    http = GuardHttp.create()
    try:
        assert isinstance(http.canary, HttpxExchanges) and http.canary.client is http.spec_urls
    finally:
        await http.close()


async def test_the_model_is_discovered(fp8: str) -> None:
    async with httpx.AsyncClient() as client:
        assert await discover_model(client, fp8 + "/v1/") == MODEL
        report = await run_canary(client, fp8, None, sessions=1, rounds=1)
    assert report.model == MODEL and report.counts[VerdictKind.OK] == 1


def test_prompts_depend_on_seed_and_session_only() -> None:
    assert session_steps(7, 3, 4) == session_steps(7, 3, 4)
    assert session_steps(7, 3, 4) != session_steps(7, 4, 4)
    assert session_steps(7, 3, 4) != session_steps(8, 3, 4)
    steps = session_steps(0, 0, 3)
    user = first_messages(0, 0, steps)[1]["content"]
    assert all(step.text in user for step in steps)
    import random

    result = fake_result("get_weather", {"location": "Oslo"}, random.Random(0), 1, steps)
    assert result["location"] == "Oslo" and result["next_step"] == steps[1].text


async def test_connection_refused_is_retried_then_an_error(new_client: ClientFactory) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with new_client() as client:
        report = await run_canary(client, url, MODEL, sessions=2, rounds=3, timeout=5)
        with pytest.raises(EndpointUnreachable):
            await run_canary(client, url, None, sessions=1, rounds=1)
    assert report.responses == 2 and report.errors == 2 and report.classified == 0
    for record in report.records:
        assert record.attempts == MAX_ATTEMPTS and record.status is None
        assert "cannot connect" in record.verdict.reason
    assert all(s.outcome == "incomplete" for s in report.session_results)
    assert report.sessions_observed == 0 and report.session_leak_rate == 0.0


def _chat_requests(url: str) -> int:
    return int(httpx.get(f"{url}/server_info").json()["internal_states"][0]["chat_requests"])


async def test_an_http_error_is_not_retried(new_client: ClientFactory) -> None:
    with DoubleProcess(["--context-length", "20"], FP8_ENV) as double:
        async with new_client() as client:
            report = await run_canary(client, double.url, MODEL, sessions=3, rounds=2)
        assert _chat_requests(double.url) == 3  # one request per session, no retry
    assert [r.verdict.reason for r in report.records] == ["HTTP 400"] * 3
    assert all(r.attempts == 1 and r.status == 400 for r in report.records)
    assert "context length" in report.records[0].verdict.snippet


async def test_a_timeout_is_not_retried(new_client: ClientFactory) -> None:
    # The double takes at least 45 s to answer (60 s x 0.75..1.25), 20 times the 2 s timeout:
    # no machine is slow enough to turn that into an answer; the double is stopped unanswered.
    with DoubleProcess([], {**FP8_ENV, "DSV4_DOUBLE_LATENCY_MS": "60000"}) as double:
        async with new_client() as client:
            report = await run_canary(client, double.url, MODEL, sessions=2, rounds=2, timeout=2)
        assert _chat_requests(double.url) == 2
    assert all(r.verdict.kind is VerdictKind.ERROR for r in report.records)
    assert all("timeout" in r.verdict.reason and r.attempts == 1 for r in report.records)


async def test_a_server_crash_mid_request_is_not_retried_but_later_refusals_are(
    new_client: ClientFactory,
) -> None:
    env = {**FP8_ENV, "DSV4_DOUBLE_OOM_AFTER": "4", "DSV4_DOUBLE_LATENCY_MS": "5"}
    with DoubleProcess([], env) as double:
        async with new_client() as client:
            report = await run_canary(
                client, double.url, MODEL, sessions=3, rounds=2, concurrency=1, timeout=5
            )
        assert double.wait(10) == -9
    # Chronologically (concurrency 1): s0r1 s1r1 s2r1 s0r2 ok, s1r2 crashes the server, s2r2
    # is refused (retried) or, racing the dying listener, reset after it was sent (not retried).
    by_round = {(r.session, r.round): r for r in report.records}
    assert [by_round[k].verdict.kind for k in [(0, 1), (1, 1), (2, 1), (0, 2)]] == [
        VerdictKind.OK
    ] * 4
    crashed, after = by_round[(1, 2)], by_round[(2, 2)]
    assert crashed.verdict.kind is VerdictKind.ERROR and crashed.attempts == 1
    assert "transport error" in crashed.verdict.reason  # the request was sent: never retried
    assert after.verdict.kind is VerdictKind.ERROR
    if "cannot connect" in after.verdict.reason:
        assert after.attempts == MAX_ATTEMPTS
    else:
        assert after.attempts == 1 and "transport error" in after.verdict.reason


@pytest.mark.parametrize(
    "kwargs",
    [{"sessions": 0}, {"rounds": 0}, {"concurrency": 0}, {"timeout": 0}, {"confidence": 1.0}],
)
async def test_bad_parameters(kwargs: dict[str, Any]) -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(ValueError):
            await run_canary(client, "http://127.0.0.1:1", MODEL, **kwargs)


# --- dsv4 probe -----------------------------------------------------------------------------


def probe(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["probe", *args])
    return result.exit_code, result.stdout, result.stderr


def test_probe_exits_0_on_fp8(fp8: str) -> None:
    # 0 of 60 sessions: the 99% upper bound is 9.96%, under a 10% threshold (CLEAN).
    code, out, err = probe("--url", fp8, "--sessions", "60", "--rounds", "4", "--threshold", "0.1")
    assert code == 0, out + err
    assert "verdict    CLEAN" in out
    assert "responses  240 (ok 240" in out
    assert "leak rate  per session  0/60 = 0.0%" in out
    assert "latency    p50" in out
    assert "probing" in err  # the progress bar goes to stderr


def test_probe_exits_1_on_bf16_hicache(bf16_hicache: str) -> None:
    code, out, err = probe("--url", bf16_hicache, "--sessions", "60", "--rounds", "4")
    assert code == 1, out + err
    assert "LEAKING" in out and "examples of corrupted outputs" in out


def test_probe_json_and_vs(fp8: str, bf16_hicache: str) -> None:
    code, out, _ = probe(
        "--url", bf16_hicache, "--vs", fp8, "--sessions", "60", "--rounds", "4", "-o", "json"
    )
    assert code == 1
    payload = json.loads(out)
    assert_contract("probe", payload)
    dirty, clean = payload["results"]
    assert dirty["judgement"] == "leaking" and dirty["significantlyAbove"] is True
    low, high = leak_band(BF16_HICACHE_CONFIG, DECLARED_LOAD, 60, 4)
    assert low <= dirty["sessionLeakRate"]["leaks"] <= high
    assert clean["sessionLeakRate"]["leaks"] == 0 and clean["significantlyAbove"] is False
    comparison = payload["comparison"]
    assert comparison["significant"] is True and comparison["pValue"] < 0.01
    assert comparison["k1"] == dirty["sessionLeakRate"]["leaks"]
    assert payload["exitCode"] == 1 and payload["per"] == "sessions"


def test_probe_per_response_threshold(fp8: str) -> None:
    code, out, _ = probe(
        "--url", fp8, "--sessions", "5", "--rounds", "2", "--per", "responses", "-o", "json"
    )
    assert code == 3  # 0 of 10 responses: too few to tell a 2% leak rate from none
    payload = json.loads(out)
    assert_contract("probe", payload)
    assert payload["results"][0]["responseLeakRate"]["of"] == 10
    assert payload["results"][0]["judgement"] == "inconclusive" and payload["exitCode"] == 3


def test_probe_exits_3_when_inconclusive(fp8: str) -> None:
    """No leak in 60 sessions cannot tell a 2% leak rate from none (upper bound 9.96%): a CI
    job that passes on exit 0 must not pass on it."""
    code, out, err = probe("--url", fp8, "--sessions", "60", "--rounds", "4")
    assert code == 3, out + err
    assert "verdict    INCONCLUSIVE: not significantly above 2.0%" in out
    assert "upper bound 10.0%" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "not-a-url"], "is not an http(s) URL"),
        (["--url", "http://127.0.0.1:1"], "cannot connect"),
        (["--url", "http://127.0.0.1:1", "--model", "m", "--sessions", "1", "--rounds", "1"],
         "no response from http://127.0.0.1:1 could be classified"),
    ],
)  # fmt: skip
def test_probe_exits_2_on_bad_input(args: list[str], message: str) -> None:
    code, out, err = probe(*args)
    assert code == 2
    assert message in err and out == ""

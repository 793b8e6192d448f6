"""The engines as the guard's source: their /metrics to counts per revision (read through
httpx.MockTransport), their /server_info against the plan, the window's memory across a
restart, and the conditions (PlanVerified, LeakShapesVisible) a reconcile pass writes."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.api.status import GuardStatus
from dsv4_operator.guard.engine import EngineCounts, engine_counts, parse_engine_counts
from dsv4_operator.guard.observations import Observations, Snapshot
from dsv4_operator.guard.plan import PlanExpectation, ServerInfo, check_plan, rendered_args
from dsv4_operator.guard.policy import Evidence, evaluate
from dsv4_operator.metrics import GuardMetrics
from dsv4_operator.names import LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import ConditionReason, GuardResult, RollbackReason
from dsv4_operator.reconcile.decide import decide
from dsv4_operator.signals.engine import EngineReader
from dsv4_operator.signals.http import HttpxPages
from tests.support.builders import NOW, as_live, make_world

GUARD = GuardSpec()

# What a 0.5.23 decode engine with the drop-counter patch serves (multiprocess registry: one
# series per label set; the scheduler's counters once per tensor-parallel rank).
DECODE_METRICS = """\
# HELP sglang:dsv4_tool_call_responses_total Tool-calling responses parsed.
# TYPE sglang:dsv4_tool_call_responses_total counter
sglang:dsv4_tool_call_responses_total{model_name="m"} 200.0
# HELP sglang:dsv4_tool_call_drops_total Responses with a dropped tool call.
# TYPE sglang:dsv4_tool_call_drops_total counter
sglang:dsv4_tool_call_drops_total{model_name="m",reason="unclosed"} 6.0
sglang:dsv4_tool_call_drops_total{model_name="m",reason="unterminated_section"} 3.0
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{is_streaming="false",model_name="m"} 250.0
sglang:num_requests_total{is_streaming="true",model_name="m"} 50.0
# HELP sglang:num_transfer_failed_reqs_total The number of transfer failed requests.
# TYPE sglang:num_transfer_failed_reqs_total counter
sglang:num_transfer_failed_reqs_total{engine_type="decode",model_name="m",tp_rank="0"} 4.0
sglang:num_transfer_failed_reqs_total{engine_type="decode",model_name="m",tp_rank="1"} 4.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.4
"""


def test_an_engine_s_metrics_become_flat_counts_one_rank_counted_once() -> None:
    counts = parse_engine_counts(DECODE_METRICS)
    assert counts == {
        "responses": 200.0,
        "drops:unclosed": 6.0,
        "drops:unterminated_section": 3.0,
        "requests": 300.0,
        "transfer_failed": 4.0,  # both ranks counted the same aborted requests
    }
    decode = engine_counts(counts, decode=True)
    assert (decode.responses, decode.drops, decode.requests, decode.transfer_failures) == (
        200,
        9,
        300,
        4,
    )
    assert decode.drop_reasons == {"unclosed": 6, "unterminated_section": 3}
    # A prefill pod answers no client: only its failed transfers are its revision's.
    assert engine_counts(counts, decode=False) == EngineCounts(transfer_failures=4)
    # Plain upstream 0.5.23: no drop counter, the transfer failures still read.
    assert parse_engine_counts("sglang:num_transfer_failed_reqs_total 2.0\n") == {
        "transfer_failed": 2.0
    }


def _pod(
    name: str,
    uid: str,
    role: str,
    revision: str,
    ip: str,
    created: str,
    ready: bool = True,
    group: tuple[str, int, int] | None = None,
    container: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An engine pod; `group`: (LeaderWorkerSet, group index, worker index) of a multi-node
    role's pod (a worker has no readiness probe: Ready once it runs); `container`: its
    engine container's status as the kubelet writes it."""
    labels = {"dsv4.io/role": role, "dsv4.io/revision": revision}
    if group is not None:
        lws, index, worker = group
        labels |= {
            LWS_NAME_LABEL: lws,
            LWS_GROUP_INDEX_LABEL: str(index),
            LWS_WORKER_INDEX_LABEL: str(worker),
        }
    return {
        "metadata": {"name": name, "uid": uid, "creationTimestamp": created, "labels": labels},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [container or {"name": "engine", "restartCount": 0}],
        },
    }


OLD = "2026-11-29T11:00:00Z"  # before the loop started (NOW)
NEW = "2026-11-29T12:00:05Z"  # after


def _metrics(responses: int, drops: int, failed: int = 0) -> str:
    return (
        f"sglang:dsv4_tool_call_responses_total {responses}\n"
        f'sglang:dsv4_tool_call_drops_total{{reason="malformed"}} {drops}\n'
        f"sglang:num_requests_total {responses}\n"
        f"sglang:num_transfer_failed_reqs_total {failed}\n"
    )


class Engines:
    """Engine pods behind a MockTransport: /metrics from a table, /server_info counted; a
    `workers` host answers as a group worker's health-only server (no /server_info)."""

    def __init__(self) -> None:
        self.metrics: dict[str, str] = {}
        self.info_reads: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.down: set[str] = set()
        self.workers: set[str] = set()

    def reply(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        assert request.url.port == 30000
        self.reads[host] += 1
        if host in self.down:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/server_info":
            self.info_reads[host] += 1
            if host in self.workers:
                return httpx.Response(404, json={"detail": "Not Found"})
            return httpx.Response(
                200, json={"max_total_num_tokens": 1000, "version": "0.5.23", "tp_size": 4}
            )
        assert request.url.path == "/metrics"
        return httpx.Response(200, text=self.metrics[host])


async def test_engine_counts_go_to_the_revision_on_each_pod_s_label() -> None:
    engines = Engines()
    old = [
        _pod("x-decode-0", "d-old", "decode", "r1", "10.0.0.1", OLD),
        _pod("x-prefill-0", "p-old", "prefill", "r1", "10.0.0.2", OLD),
    ]
    engines.metrics = {"10.0.0.1": _metrics(500, 5, 1), "10.0.0.2": _metrics(0, 0, 2)}
    key = ("ns", "x")
    async with httpx.AsyncClient(transport=httpx.MockTransport(engines.reply)) as client:
        reader = EngineReader(HttpxPages(client))
        pods = [PodView.of(p) for p in old]
        first = await reader.round(key, pods, started=NOW)
        # Pods older than the loop: their first read is a baseline (status may hold it).
        assert first.counts == {} and first.revisions == {"r1"}
        assert set(first.server_info) == {"d-old", "p-old"}
        engines.metrics = {"10.0.0.1": _metrics(600, 9, 1), "10.0.0.2": _metrics(0, 0, 3)}
        # A new revision's decode pod started after the loop: all it counted is r2's.
        fresh = _pod("x-decode-1", "d-new", "decode", "r2", "10.0.0.3", NEW)
        engines.metrics["10.0.0.3"] = _metrics(40, 4)
        second = await reader.round(key, [*pods, PodView.of(fresh)], started=NOW)
        assert second.counts["r1"] == EngineCounts(
            responses=100, drops=4, requests=100, transfer_failures=1, drop_reasons={"malformed": 4}
        )
        assert second.counts["r2"] == EngineCounts(
            responses=40, drops=4, requests=40, drop_reasons={"malformed": 4}
        )
        # A restarted engine counts from zero: its count is all new; one that cannot be read
        # is named and counts nothing.
        engines.metrics["10.0.0.1"] = _metrics(10, 1)
        engines.down.add("10.0.0.3")
        third = await reader.round(key, [*pods, PodView.of(fresh)], started=NOW)
        assert third.counts == {
            "r1": EngineCounts(
                responses=10,
                drops=1,
                requests=10,
                drop_reasons={"malformed": 1},
            )
        }
        assert third.failed == ["x-decode-1: ConnectError"]
    # /server_info once per pod, however many rounds.
    assert engines.info_reads == {"10.0.0.1": 1, "10.0.0.2": 1, "10.0.0.3": 1}


async def test_an_engine_loading_its_weights_is_on_its_way_not_unreachable() -> None:
    """Not Ready and never read: not read (its port opens once the weights are loaded); Ready,
    read; read before and not Ready now, still read: its silence is news."""
    engines = Engines()
    engines.down.add("10.0.0.1")
    key = ("ns", "x")

    def decode(ready: bool) -> PodView:
        return PodView.of(_pod("x-decode-0", "d1", "decode", "r1", "10.0.0.1", NEW, ready=ready))

    async with httpx.AsyncClient(transport=httpx.MockTransport(engines.reply)) as client:
        reader = EngineReader(HttpxPages(client))
        loading = await reader.round(key, [decode(ready=False)], started=NOW)
        assert (loading.failed, loading.pods_changed, engines.reads) == ([], True, {})
        engines.down.clear()
        engines.metrics["10.0.0.1"] = _metrics(7, 1)
        ready = await reader.round(key, [decode(ready=True)], started=NOW)
        assert ready.counts == {  # started after the loop: counted from zero
            "r1": EngineCounts(responses=7, drops=1, requests=7, drop_reasons={"malformed": 1})
        }
        assert set(ready.server_info) == {"d1"}
        engines.down.add("10.0.0.1")
        gone_quiet = await reader.round(key, [decode(ready=False)], started=NOW)
        assert gone_quiet.failed == ["x-decode-0: ConnectError"]


async def test_an_engine_restarted_in_place_is_reloading_not_unreachable() -> None:
    """Read before, then its container restarted (the kubelet's restartCount) and the pod not
    Ready: not read (its port is closed while it reloads), named as restarting with why, and
    on its way; Ready again, read, its counters started over. Not Ready with no restart, or
    restarted and Ready again by its own probe: read, its silence is news."""
    engines = Engines()
    engines.metrics["10.0.0.1"] = _metrics(7, 1)
    key = ("ns", "x")
    oom_killed = {
        "name": "engine",
        "restartCount": 1,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
    }

    def decode(ready: bool, container: dict[str, Any] | None = None) -> PodView:
        return PodView.of(
            _pod("x-decode-0", "d1", "decode", "r1", "10.0.0.1", OLD, ready, container=container)
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(engines.reply)) as client:
        reader = EngineReader(HttpxPages(client))
        await reader.round(key, [decode(ready=True)], started=NOW)  # the baseline
        engines.down.add("10.0.0.1")
        reads = engines.reads["10.0.0.1"]
        restarted = await reader.round(key, [decode(False, oom_killed)], started=NOW)
        assert (restarted.failed, restarted.pods_changed) == ([], True)
        assert restarted.restarting == [
            "x-decode-0: restarted in place "
            "(restarts 1; last exit OOMKilled, code 137; waiting CrashLoopBackOff)"
        ]
        assert restarted.revisions == {"r1"}
        assert engines.reads["10.0.0.1"] == reads  # not read
        engines.down.clear()
        engines.metrics["10.0.0.1"] = _metrics(3, 0)
        running = {**oom_killed, "state": {"running": {}}}
        again = await reader.round(key, [decode(True, running)], started=NOW)
        assert (again.restarting, again.failed) == ([], [])
        assert again.counts == {"r1": EngineCounts(responses=3, requests=3)}
        engines.down.add("10.0.0.1")
        hung = await reader.round(key, [decode(False, running)], started=NOW)
        assert (hung.restarting, hung.failed) == ([], ["x-decode-0: ConnectError"])
        # Restarted again and Ready by its own probe: read, and a failure is news.
        twice = {**running, "restartCount": 2}
        ready_again = await reader.round(key, [decode(True, twice)], started=NOW)
        assert (ready_again.restarting, ready_again.failed) == ([], ["x-decode-0: ConnectError"])


async def test_a_groups_worker_is_read_once_its_leader_is_ready_and_only_the_leader_s_plan() -> (
    None
):
    """A multi-node group: the worker (Ready once it runs: no probe) is read only once the
    leader is Ready; /metrics of both, /server_info of the leader only (the worker's health-
    only server has none), and the plan counts the leader."""
    engines = Engines()
    engines.workers.add("10.0.0.4")
    engines.metrics = {"10.0.0.3": _metrics(10, 0, 1), "10.0.0.4": _metrics(0, 0, 2)}
    key = ("ns", "x")

    def group(leader_ready: bool, worker_restarts: int = 0) -> list[PodView]:
        return [
            PodView.of(_pod("x-prefill-0", "p1", "prefill", "r1", "10.0.0.2", NEW)),
            PodView.of(
                _pod(
                    "x-decode-0",
                    "d1",
                    "decode",
                    "r1",
                    "10.0.0.3",
                    NEW,
                    leader_ready,
                    ("x-decode", 0, 0),
                )
            ),
            PodView.of(
                _pod(
                    *("x-decode-0-1", "d1w", "decode", "r1", "10.0.0.4", NEW, True),
                    ("x-decode", 0, 1),
                    {"name": "engine", "restartCount": worker_restarts},
                )
            ),
        ]

    engines.metrics["10.0.0.2"] = _metrics(0, 0)
    async with httpx.AsyncClient(transport=httpx.MockTransport(engines.reply)) as client:
        reader = EngineReader(HttpxPages(client))
        first = await reader.round(key, group(leader_ready=False), started=NOW)
        assert (first.failed, first.pods_changed) == ([], True)
        assert set(engines.reads) == {"10.0.0.2"}  # the single-node prefill pod alone
        second = await reader.round(key, group(leader_ready=True), started=NOW)
        third = await reader.round(key, group(leader_ready=True), started=NOW)
        # The worker restarted in place (its leader still Ready, so "up"): read, and its
        # failure to answer is its restart, not silence.
        engines.down.add("10.0.0.4")
        restarted = await reader.round(key, group(True, worker_restarts=1), started=NOW)
        assert restarted.failed == []
        assert restarted.restarting == ["x-decode-0-1: restarted in place (restarts 1)"]
    assert second.failed == [] and third.failed == []
    assert second.counts["r1"].transfer_failures == 3  # the leader's 1 and the worker's 2
    assert set(third.server_info) == {"p1", "d1"}
    assert engines.info_reads == {"10.0.0.2": 1, "10.0.0.3": 1}  # never the worker's
    infos = {
        "p1": _info(900_000, tp_size=4, mem_fraction_static=0.85),
        "d1": _info(800_000, tp_size=4, disaggregation_enable_kv_checksum=True),
    }
    verified = check_plan(EXPECTED, group(leader_ready=True), infos)
    assert verified.verified, verified.message
    assert verified.message.startswith("all 2 engine pod(s) of revision r1")


def test_a_revision_s_engines_dropping_calls_fail_it_and_say_how() -> None:
    evidence = Evidence(samples=0, engine_samples=1000, engine_leaks=46)  # 4.6%
    verdict = evaluate(evidence, GUARD)
    assert (verdict.outcome, verdict.reason) == (GuardResult.FAIL, "EngineToolCallDrops")
    assert verdict.rollback_reason is RollbackReason.LEAK_RATE
    assert verdict.message.startswith("engine: the parser dropped a tool call in 46/1000")
    for samples, leaks in ((1000, 5), (30, 2), (0, 0)):  # healthy, or too few to tell
        verdict = evaluate(Evidence(engine_samples=samples, engine_leaks=leaks), GUARD)
        assert verdict.reason == "TooFewSamples"


def test_kv_transfer_failures_fail_a_revision_before_its_bake_only() -> None:
    failing = Evidence(samples=1000, kv_requests=2000, kv_failures=40)  # 2%
    verdict = evaluate(failing, GUARD)
    assert (verdict.outcome, verdict.reason) == (GuardResult.FAIL, "KVIntegrity")
    assert verdict.rollback_reason is RollbackReason.KV_INTEGRITY
    assert "40 failed for 2000 requests" in verdict.message
    baked = Evidence(samples=1000, kv_requests=2000, kv_failures=40, baked=True)
    assert evaluate(baked, GUARD).reason == "LeakRate"  # the alert's from now on
    healthy = Evidence(samples=1000, kv_requests=2000, kv_failures=2)  # 0.1%
    assert evaluate(healthy, GUARD).reason == "LeakRate"


EXPECTED = PlanExpectation(
    revision="r1",
    sglang_version="0.5.23",
    max_total_tokens={"prefill": 900_000, "decode": 800_000},
    args={
        "prefill": rendered_args(["--tp-size", "4", "--mem-fraction-static", "0.85"]),
        "decode": rendered_args(
            ["--tp-size", "4", "--disaggregation-enable-kv-checksum", "--context-length", "131072"]
        ),
    },
)


def _engine_pods(revision: str = "r1") -> list[PodView]:
    return [
        PodView.of(_pod("x-prefill-0", "p1", "prefill", revision, "10.0.0.2", OLD)),
        PodView.of(_pod("x-decode-0", "d1", "decode", revision, "10.0.0.1", OLD)),
    ]


def _info(tokens: int, version: str = "0.5.23", **args: Any) -> ServerInfo:
    return ServerInfo.of({"max_total_num_tokens": tokens, "version": version, **args})


def test_the_plan_is_verified_when_every_engine_reports_it() -> None:
    assert rendered_args(["--x", "--disaggregation-enable-kv-checksum", "--tp-size", "4"]) == {
        "disaggregation_enable_kv_checksum": True,
        "tp_size": "4",
    }
    pods = _engine_pods()
    none = check_plan(EXPECTED, pods, {})
    assert none.reason is ConditionReason.NOT_ANSWERED
    assert none.message == "0 of 2 engine pod(s) of revision r1 answered /server_info"
    half = check_plan(EXPECTED, pods, {"d1": _info(800_000)})
    assert half.reason is ConditionReason.NOT_ANSWERED
    infos = {
        "p1": _info(900_000, "0.5.23+cu129", tp_size=4, mem_fraction_static=0.85),
        "d1": _info(800_000, tp_size=4, disaggregation_enable_kv_checksum=True),
    }
    verified = check_plan(EXPECTED, pods, infos)
    assert verified.verified, verified.message
    assert "prefill 900000, decode 800000" in verified.message
    # Pods of other revisions are not this revision's to verify.
    assert check_plan(EXPECTED, _engine_pods("r2"), infos).reason is ConditionReason.NOT_ANSWERED


@pytest.mark.parametrize(
    ("decode", "said"),
    [
        (_info(760_000), "max_total_num_tokens 760000, the plan 800000"),
        (_info(800_000, "0.5.16"), "version 0.5.16, spec.engine.sglangVersion 0.5.23"),
        (_info(800_000, "9" * 500), f"version {'9' * 61}..., spec"),  # what status shows: short
        (_info(800_000, context_length=65536), "context_length 65536, rendered 131072"),
        (
            _info(800_000, disaggregation_enable_kv_checksum=False),
            "disaggregation_enable_kv_checksum False, rendered True",
        ),
    ],
)
def test_a_mismatch_names_the_pod_and_both_values(decode: ServerInfo, said: str) -> None:
    check = check_plan(EXPECTED, _engine_pods(), {"d1": decode})  # prefill not answered yet
    assert check.mismatch
    assert check.message.startswith("engine pod x-decode-0 (decode) of revision r1 reports ")
    assert said in check.message


def test_a_restart_resumes_the_engine_counts_from_status_and_adds_what_came_since() -> None:
    observations, key = Observations(), ("ns", "x")
    # The engine loop ran before the first reconcile pass after the restart.
    observations.record_engine(key, {"r1": EngineCounts(responses=10, drops=1)}, {"r1"}, {})
    previous = GuardStatus(
        revision="r1", samples=40, leaks=0, engine_samples=500, engine_leaks=5, kv_requests=500
    )
    observations.resume(key, previous)
    observations.resume(key, previous)  # once per key
    snapshot = observations.snapshot(key)
    assert snapshot is not None
    assert (snapshot.revision, snapshot.samples) == ("r1", 40)
    assert snapshot.engine["r1"] == EngineCounts(
        responses=510, drops=6, requests=500, drop_reasons=None
    )
    # A revision without pods any more is forgotten, unless it is the window's.
    observations.record_engine(key, {"r2": EngineCounts(responses=3)}, {"r2"}, {})
    snapshot = observations.snapshot(key)
    assert snapshot is not None and set(snapshot.engine) == {"r1", "r2"}
    observations.record(key, "r2", {"ok": 1}, 0, NOW)
    observations.record_engine(key, {}, {"r3"}, {})
    snapshot = observations.snapshot(key)
    assert snapshot is not None and set(snapshot.engine) == {"r2"}


def _served(changes: dict[str, Any], variant: Any) -> tuple[dict[str, Any], Any]:
    spec = variant(changes)
    return spec, decide(make_world(spec))


def _conditions(decision: Any) -> dict[str, Any]:
    return {c.type: c for c in decision.status.conditions}


def test_leak_shapes_visible_says_what_the_image_lets_the_guard_see(variant: Any) -> None:
    _, plain = _served({"engine.capabilities": []}, variant)
    shapes = _conditions(plain)["LeakShapesVisible"]
    assert (shapes.status, shapes.reason) == ("False", "NoDropCounter")
    assert "cannot see silent drops on tool_choice: auto traffic" in shapes.message
    assert "the canary, which knows a call is due, remains the signal" in shapes.message
    _, counted = _served({"engine.capabilities": ["toolCallDropCounter"]}, variant)
    shapes = _conditions(counted)["LeakShapesVisible"]
    assert (shapes.status, shapes.reason) == ("True", "EngineCounts")


def test_a_plan_mismatch_is_a_condition_an_event_a_metric_and_no_bake(variant: Any) -> None:
    spec, first = _served({"guard.bakeTime": "10m"}, variant)
    revision = first.create[0]["metadata"]["labels"]["dsv4.io/revision"]
    plan = first.status.plan
    pods = [
        _pod(f"x-{role}-0", f"{role}-uid", role, revision, f"10.0.0.{i}", OLD)
        for i, role in enumerate(("prefill", "decode"))
    ]
    version = spec["engine"]["sglangVersion"]
    infos = {
        "prefill-uid": _info(plan.max_total_tokens.prefill, version),
        "decode-uid": _info(plan.max_total_tokens.decode - 4096, version),
    }
    seen = Snapshot(revision=revision, samples=1000, leaks=0, server_info=infos)
    live = {**as_live(first.apply), "revisions": first.create, "pods": pods}
    started = decide(make_world(spec, canary=seen, **live))
    check = _conditions(started)["PlanVerified"]
    assert (check.status, check.reason) == ("False", "PlanMismatch")
    assert f"x-decode-0 (decode) of revision {revision}" in check.message
    assert str(plan.max_total_tokens.decode) in check.message
    assert [n.reason for n in started.events if n.type == "Warning"] == ["PlanMismatch"]
    later = decide(
        make_world(
            spec, canary=seen, status=started.status, now=NOW + timedelta(minutes=11), **live
        )
    )
    assert later.status.last_known_good_revision is None  # passing for bakeTime, not baked
    assert not [n for n in later.events if n.reason == "PlanMismatch"]  # said once
    metrics = GuardMetrics()
    metrics.observe(("ns", "x"), None, later.status, [], [], (revision, False))
    labels = {"namespace": "ns", "deployment": "x", "revision": revision}
    assert REGISTRY.get_sample_value("dsv4_plan_verified", labels) == 0.0
    # The engine reports its plan: verified, and the revision bakes.
    infos["decode-uid"] = _info(plan.max_total_tokens.decode, version)
    fixed = Snapshot(revision=revision, samples=1000, leaks=0, server_info=infos)
    baked = decide(
        make_world(spec, canary=fixed, status=later.status, now=NOW + timedelta(minutes=12), **live)
    )
    assert _conditions(baked)["PlanVerified"].reason == "Verified"
    assert baked.status.last_known_good_revision == revision
    metrics.observe(("ns", "x"), None, baked.status, [], [], None)
    assert REGISTRY.get_sample_value("dsv4_plan_verified", labels) is None

"""The guard reads what the engines report, end to end: real API server, the operator, and the
engine double in place of each engine pod at the pod's IP (engine_support.PodEngines), as
SGLang 0.5.23 with the drop-counter patch.

- A change that makes the decode engine drop tool calls silently (prose, HTTP 200, no
  `tool_calls`) under `tool_choice: auto` production traffic (20 requests a second), sent
  through `dsv4 tap` in front of the decode engine as the router's sidecar would be, is
  rolled back on the engines' own counter, reason `EngineToolCallDrops`, while the canary,
  slowed to one run in 10 minutes, holds no sample of it and the tap, which reads each
  answer, counts no leak (a dropped call on `auto` traffic reads as prose). The change is the
  incident's (bf16 index-K with HiCache): the double corrupts 4.55% of responses at the
  declared load, each into an output 0.5.23's deepseek-recipe cannot read and drops
  (`DSV4_DOUBLE_SILENT_DROP_SHARE=1`). The test prints the seconds from the leaking decode
  engine's start to the guard's Fail verdict; `ENGINE_GUARD_E2E_SEED` seeds the double and
  the traffic (bench/engine_guard_decisions.py runs it over seeds and prints the median).
- A change whose KV transfers fail their checksum for 2% of requests (HTTP 500) is rolled
  back before it bakes, rollback reason `KVIntegrity`.
- An engine that reports another `max_total_num_tokens` than its plan is never baked:
  `PlanVerified=False`, reason `PlanMismatch`, though its canary passes.
- Engine pods that run while their engines load their weights, port closed, are on their way,
  not unreachable; once the kubelet's prober makes them Ready, their plan is verified. An
  engine restarted in place (the same pod) that reloads is counted restarting, not
  unreachable, until it is Ready again.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch
from urllib3.exceptions import ProtocolError

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import Cluster, example
from dsv4_devcluster.operator import OperatorProcess
from dsv4_devcluster.process import free_port

from .engine_support import (
    KUBELET_ANNOTATIONS,
    ROLES,
    PodEngines,
    cluster_fixture,
    gpu_pool_fixture,
    loopback_ips,
)
from .guard_support import Traffic, tap_process

pytestmark = pytest.mark.integration

CAPABILITIES = ["bf16IndexK", "poolSizingFix", "toolCallDropCounter"]
LEAKING = {  # bf16 index-K with HiCache, no indexKHiCacheGate: 4.55% of calls at load 60
    "engine.indexKDtype": "bf16",
    "engine.hicache": {"enabled": True},
    "safety.policy": "Warn",
}


# The same `long` for the three tests: ordered by it, they stay together, so this module's
# node pool is set up once per worker (a second setup would register the same nodes again).
gpu_pool = gpu_pool_fixture("engines-rtx", 3)
cluster = cluster_fixture()


@pytest.fixture
def ips() -> dict[str, str]:
    return loopback_ips()


SEED = int(os.environ.get("ENGINE_GUARD_E2E_SEED", "0"))


@pytest.fixture
def ports() -> dict[str, int]:
    return {"tap": free_port(), "tap_metrics": free_port()}


@pytest.fixture
def operator(
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    ips: dict[str, str],
    ports: dict[str, int],
) -> Iterator[OperatorProcess]:
    allowed = [f"http://{ips['decode']}:30000", f"http://127.0.0.1:{ports['tap_metrics']}"]
    op = OperatorProcess(
        control_plane.kubeconfig_path,
        namespace,
        tmp_path,
        DSV4_CANARY_ENDPOINT_ALLOW=",".join(allowed),
        DSV4_MIN_CANARY_INTERVAL="1s",
    ).start()
    yield op
    op.stop()
    print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(80)}")


@pytest.fixture
def engines(cluster: Cluster, tmp_path: Path, ips: dict[str, str]) -> Iterator[PodEngines]:
    # Every corruption an output the parser cannot read: a silent drop on 0.5.23.
    knobs = {"DSV4_DOUBLE_SILENT_DROP_SHARE": "1", "DSV4_DOUBLE_SEED": str(SEED)}
    doubles = PodEngines(cluster, ips, tmp_path, knobs=knobs)
    doubles.start()
    yield doubles
    doubles.stop()


@pytest.fixture
def tap(
    engines: PodEngines, ports: dict[str, int], tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`dsv4 tap` as the router pod runs it, in front of the decode engine."""
    with tap_process(engines.url, ports, tmp_path, engines.cluster.namespace) as proc:
        yield proc


def _spec(
    namespace: str,
    endpoint: str,
    canary_interval: str | None,
    tap_metrics: str | None = None,
    **changes: Any,
) -> Any:
    tap = (
        {"interval": "1s", "metricsEndpoints": [tap_metrics]} if tap_metrics else {"enabled": False}
    )
    guard = {
        "enabled": True,
        # No interval: the canary off (the guard's other sources decide alone).
        "canary": {
            "enabled": True,
            "sessions": 32,
            "rounds": 4,
            "interval": canary_interval,
            "endpoint": endpoint,
        }
        if canary_interval is not None
        else {"enabled": False},
        "tap": tap,
        "engine": {"interval": "1s"},
        "leakRate": {"threshold": 0.02, "minSamples": 30, "confidence": 0.99},
        "bakeTime": "5s",
    }
    base = {
        "engine.sglangVersion": "0.5.23",
        "engine.image": "registry.example.com/dsv4-engine:0.5.23-p1",
        "engine.capabilities": CAPABILITIES,
    }
    return example(namespace, **{"guard": guard, **base, **changes})


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def _plan_verified(cluster: Cluster, reason: str) -> dict[str, Any]:
    """The PlanVerified condition, once it has `reason`."""
    found: dict[str, Any] = wait_for(
        f"PlanVerified {reason}",
        lambda: (lambda c: c if c.get("reason") == reason else None)(
            _condition(cluster.get(), "PlanVerified")
        ),
        timeout=120,
    )
    return found


class GuardWatch:
    """Every status.guard the operator writes, from a watch (a rollback's verdict stands in
    status for one pass only, then the window moves to the revision rolled back to)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.seen: list[dict[str, Any]] = []
        self.seen_at: list[float] = []  # time.monotonic() of each
        self._watcher = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        events = self.cluster.dsv4.watch(
            namespace=self.cluster.namespace, name="dsv4-flash", watcher=self._watcher
        )
        with contextlib.suppress(ProtocolError):  # the stream cut when the watch stops
            for event in events:
                guard = (event["raw_object"].get("status") or {}).get("guard")
                if guard and (not self.seen or self.seen[-1] != guard):
                    self.seen.append(guard)
                    self.seen_at.append(time.monotonic())

    def verdict(self, revision: str) -> tuple[dict[str, Any], float]:
        """The first failing verdict on `revision` the operator wrote, and when it was seen."""
        found: tuple[dict[str, Any], float] = wait_for(
            f"a Fail verdict on {revision} in status.guard",
            lambda: next(
                (
                    (g, at)
                    for g, at in zip(self.seen, self.seen_at, strict=True)
                    if g.get("revision") == revision and g["lastVerdict"] == "Fail"
                ),
                None,
            ),
            timeout=30,
        )
        return found

    def __enter__(self) -> GuardWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._watcher.stop()


def _rolled_back(cluster: Cluster) -> dict[str, Any]:
    obj: dict[str, Any] = wait_for(
        "a rollback",
        lambda: (lambda o: o if o.get("status", {}).get("quarantine") else None)(cluster.get()),
        timeout=240,
    )
    return obj


@pytest.mark.long(seconds=50)
def test_silent_tool_call_drops_roll_back_on_the_engines_own_count(
    cluster: Cluster,
    operator: OperatorProcess,
    engines: PodEngines,
    tap: subprocess.Popen[bytes],
    ports: dict[str, int],
) -> None:
    namespace = cluster.namespace
    tap_metrics = f"http://127.0.0.1:{ports['tap_metrics']}/metrics"
    cluster.apply(_spec(namespace, engines.url, "2s", tap_metrics))
    # Production-like: 20 tool-calling requests a second, as bench/guard.py's silent-drop case.
    with (
        Traffic(f"http://127.0.0.1:{ports['tap']}", SEED, rate=20) as traffic,
        GuardWatch(cluster) as guards,
    ):
        good = cluster.wait_baked()
        shapes = _condition(cluster.get(), "LeakShapesVisible")
        assert (shapes["status"], shapes["reason"]) == ("True", "EngineCounts")
        scope = {"namespace": namespace, "deployment": "dsv4-flash", "revision": good}

        def counted(source: str) -> bool:
            # Live, on /metrics: status.guard has the counts as of its last write.
            return (operator.metric("dsv4_guard_window_samples", source=source, **scope) or 0) > 0

        wait_for(
            "the good revision's engines and traffic counted",
            lambda: counted("engine") and counted("traffic"),
            timeout=60,
        )
        # The leak, with the canary off, so the decision is the engines' count. (Once in 10
        # minutes was not enough: its first run comes at the namespace's phase of the
        # interval, and a random namespace put it inside the leaking revision's bake once.)
        cluster.apply(_spec(namespace, engines.url, None, tap_metrics, **LEAKING))
        obj = _rolled_back(cluster)
        [entry] = obj["status"]["quarantine"]
        verdict, decided_at = guards.verdict(entry["hash"])
        decided_after = decided_at - engines.launched("decode", entry["hash"])
        wait_for(
            "the good revision served again",
            lambda: cluster.get()["status"].get("currentRevision") == good,
            timeout=180,
        )
    print(
        f"seed {SEED}: decided {decided_after:.1f}s after the leaking decode engine started: "
        f"{entry['message']}; traffic sent {traffic.sent}, failed {traffic.failed}"
    )
    assert entry["reason"] == "LeakRate" and entry["hash"] != good
    assert entry["message"].startswith("engine: the parser dropped a tool call in ")
    assert verdict["lastReason"] == "EngineToolCallDrops"
    assert verdict["lastMessage"] == entry["message"]
    assert verdict["engineLeaks"] > 0 and verdict["engineSamples"] >= verdict["engineLeaks"]
    # The canary was off for the leaking revision: its samples there are none.
    assert verdict["samples"] == 0
    # The tap read the leaking revision's answers and saw no leak in them: on `auto` traffic
    # a dropped call is prose. Without the engines' count nothing would have decided.
    assert verdict["trafficSamples"] > 0 and verdict["trafficLeaks"] == 0
    assert [e["reason"] for e in cluster.events() if e["reason"] == "RolledBack"] == ["RolledBack"]
    assert tap.poll() is None


@pytest.mark.long(seconds=50)
def test_kv_checksum_failures_before_the_bake_roll_back_for_kv_integrity(
    cluster: Cluster, operator: OperatorProcess, engines: PodEngines
) -> None:
    namespace = cluster.namespace
    cluster.apply(_spec(namespace, engines.url, "2s"))
    with Traffic(engines.url) as traffic:
        good = cluster.wait_baked()
        decode = cluster.children()[("StatefulSet", "dsv4-flash-decode")]
        command = decode["spec"]["template"]["spec"]["containers"][0]["command"]
        # spec.transfer.kvChecksum unset: on, where the release has the flag (0.5.23 does).
        assert "--disaggregation-enable-kv-checksum" in command
        change: dict[str, Any] = {
            "engine.env": [{"name": "DSV4_DOUBLE_KV_CHECKSUM_MISMATCH_PROB", "value": "0.02"}]
        }
        cluster.apply(_spec(namespace, engines.url, "10m", **change))
        obj = _rolled_back(cluster)
    [entry] = obj["status"]["quarantine"]
    print(f"rolled back: {entry['message']}; traffic sent {traffic.sent}, failed {traffic.failed}")
    assert entry["reason"] == "KVIntegrity" and entry["hash"] != good
    assert entry["message"].startswith("KV transfers: ")
    assert _condition(obj, "RolledBack")["reason"] == "KVIntegrity"
    assert traffic.failed > 0  # the failed transfers were answered HTTP 500


@pytest.mark.long(seconds=50)
def test_an_engine_reporting_another_pool_than_its_plan_is_never_baked(
    cluster: Cluster, operator: OperatorProcess, engines: PodEngines
) -> None:
    namespace = cluster.namespace
    cluster.apply(_spec(namespace, engines.url, "2s"))
    good = cluster.wait_baked()
    verified = _plan_verified(cluster, "Verified")
    assert verified["status"] == "True"
    planned = cluster.get()["status"]["plan"]["maxTotalTokens"]
    reported = min(planned.values()) - 4096
    shrunk: dict[str, Any] = {
        "engine.env": [{"name": "DSV4_DOUBLE_REPORTED_MAX_TOTAL_TOKENS", "value": str(reported)}]
    }
    cluster.apply(_spec(namespace, engines.url, "2s", **shrunk))
    mismatch = _plan_verified(cluster, "PlanMismatch")
    assert mismatch["status"] == "False"
    # Both roles now under-report; whichever pod the operator read first is named, with its role.
    named = re.search(r"engine pod dsv4-flash-(\w+)-\d+ \((\w+)\)", mismatch["message"])
    assert named is not None and named.group(1) == named.group(2), mismatch["message"]
    role = named.group(2)
    assert f"max_total_num_tokens {reported}, the plan {planned[role]}" in mismatch["message"]
    # The canary passes the revision for far longer than bakeTime: still not baked.
    status = cluster.get()["status"]
    bad = status["guard"]["revision"]
    wait_for(
        "the revision passing",
        lambda: cluster.get()["status"]["guard"].get("lastVerdict") == "Pass",
        timeout=120,
    )
    time.sleep(15)
    status = cluster.get()["status"]
    assert status["guard"]["revision"] == bad and status["guard"]["lastVerdict"] == "Pass"
    assert status["guard"]["passingSince"]  # passing for 15 s, three times bakeTime
    assert status["lastKnownGoodRevision"] == good
    assert _condition(cluster.get(), "PlanVerified")["reason"] == "PlanMismatch"
    assert operator.metric("dsv4_plan_verified", revision=bad) == 0
    assert [e for e in cluster.events() if e["reason"] == "PlanMismatch"]


@pytest.mark.long(seconds=50)
def test_engines_loading_or_restarted_in_place_are_on_their_way_not_unreachable(
    cluster: Cluster, operator: OperatorProcess, ips: dict[str, str], tmp_path: Path
) -> None:
    """The engine pods run, as a kubelet reports them, while each engine loads its weights
    with its port closed (the double's DSV4_DOUBLE_LOADING_S, as SGLang opens its port once
    every scheduler has loaded); the kubelet's prober makes them Ready once /health_generate
    answers. The operator reads no engine before that, so it reports none unreachable (a read
    of a loading engine is refused), and it verifies their plan once they are Ready.

    Then the decode engine is killed and restarted in its pod, as a kubelet restarts a
    container (restartCount 1, the exit as lastState), and loads again: the operator names it
    restarted in place, counts it restarting and not unreachable while it reloads, and reads
    it again once Ready."""
    knobs = {"DSV4_DOUBLE_LOADING_S": "8"}
    engines = PodEngines(cluster, ips, tmp_path, knobs=knobs, kubelet=True).start()
    scope = {"namespace": cluster.namespace, "deployment": "dsv4-flash"}
    polls: list[tuple[float | None, float | None]] = []  # (restarting, unreachable)
    try:
        manual = {f"{role}.podTemplate": {"annotations": KUBELET_ANNOTATIONS} for role in ROLES}
        cluster.apply(_spec(cluster.namespace, engines.url, None, None, **manual))
        _plan_verified(cluster, "Verified")
        said = operator.log_text()  # before the engines stop: then they are unreachable
        decode = engines.pod_names["decode"]
        engines.crash("decode")
        wait_for(
            "the operator naming the restart",
            lambda: (
                f"{decode}: restarted in place (restarts 1; last exit Error, code 137)"
                in operator.log_text()
            ),
            timeout=60,
        )

        def read_again() -> bool:
            polls.append(
                (
                    operator.metric("dsv4_guard_engines_restarting", **scope),
                    operator.metric("dsv4_guard_engines_unreachable", **scope),
                )
            )
            return polls[-1][0] == 0

        wait_for("the restarted engine read again", read_again, timeout=60, interval=0.5)
    finally:
        engines.stop()
    logs = [log.read_text() for log in sorted(tmp_path.glob("engine-*.log"))]
    assert len(logs) == 3 and all("Load weight end." in log for log in logs), logs
    assert "engine /metrics unreachable" not in said, said[-4000:]
    # While it reloaded (8 s, then the prober's period): restarting, never unreachable.
    assert [r for r, _ in polls].count(1) >= 5, polls
    assert all(u == 0 for _, u in polls), polls

"""The leak tap end to end: production traffic through the tap decides a rollback before the
canary could.

The engine double answers for the rendered decode StatefulSet (EngineKubelet, as in
test_guard_e2e), at the declared load of 60 sessions. `dsv4 tap` runs here in front of it, as
the router pod's sidecar would (kwok runs no container), and a traffic generator sends
tool-calling requests through it the whole time. The guard reads the tap's /metrics
(`spec.guard.tap.metricsEndpoints`). After a good revision has baked, the canary is slowed to
an interval of hours whose first run is at least 10 minutes away, and a leaking configuration
(bf16 index-K + HiCache: 4.55% of responses) is applied: the traffic signal must roll it
back on its own, with the canary holding no sample of the bad revision.

A rollout shorter than the taps' read interval charges the responses answered before it to no
revision, in particular not to the new one (the guard reads the taps at each change of the
served revision, and counts what it read across one apart).
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import Cluster, example
from dsv4_devcluster.operator import OperatorProcess
from dsv4_devcluster.process import free_port
from dsv4_operator.signals.supervisor import phase, until_slot

from .engine_support import cluster_fixture, gpu_pool_fixture
from .guard_support import (
    EngineKubelet,
    Traffic,
    guard_operator,
    tap_ports,
    tap_process,
    tool_calling_request,
    wait_good_revision_served,
)

pytestmark = pytest.mark.integration


gpu_pool = gpu_pool_fixture("tap-rtx", 2)
cluster = cluster_fixture()


@pytest.fixture
def ports() -> dict[str, int]:
    return {**tap_ports(), "reads": free_port()}


@pytest.fixture
def operator(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, ports: dict[str, int]
) -> Iterator[OperatorProcess]:
    op = guard_operator(control_plane.kubeconfig_path, namespace, tmp_path, ports)
    yield op
    op.stop()
    print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(60)}")


@pytest.fixture
def engine(cluster: Cluster, tmp_path: Path, ports: dict[str, int]) -> Iterator[EngineKubelet]:
    kubelet = EngineKubelet(cluster, ports["engine"], tmp_path).start()
    yield kubelet
    kubelet.stop()


@pytest.fixture
def tap(ports: dict[str, int], namespace: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`dsv4 tap` as the router pod runs it, in front of the engine double."""
    upstream = f"http://127.0.0.1:{ports['engine']}"
    with tap_process(upstream, ports, tmp_path, namespace) as proc:
        yield proc


def _spec(namespace: str, ports: dict[str, int], canary_interval: str, **changes: Any) -> Any:
    guard = {
        "enabled": True,
        "canary": {
            "enabled": True,
            "sessions": 8,
            "rounds": 4,
            "interval": canary_interval,
            "endpoint": f"http://127.0.0.1:{ports['engine']}",
        },
        "tap": {
            "interval": "1s",
            "metricsEndpoints": [f"http://127.0.0.1:{ports['tap_metrics']}/metrics"],
        },
        "leakRate": {"threshold": 0.02, "minSamples": 30, "confidence": 0.99},
        "bakeTime": "5s",
    }
    return example(namespace, **{"guard": guard, **changes})


def _interval_with_no_canary_run_soon(key: tuple[str, str], margin: float = 600) -> str:
    """A canary interval whose first run, in the operator's schedule for `key`, is at least
    `margin` seconds from now: the loop restarted for the new interval runs at the key's slot
    in it (`phase`; the operator's clock is this machine's monotonic clock), which a fixed
    interval would put within the test's window once in a few dozen namespaces."""
    for hours in range(24, 0, -1):
        interval = hours * 3600.0
        if until_slot(time.monotonic(), interval, phase(key) * interval) > margin:
            return f"{hours}h"
    raise AssertionError(f"every interval of 1-24 h runs {key}'s canary within {margin} s")


@pytest.mark.long(seconds=55)
def test_production_traffic_rolls_back_a_leaking_revision_before_the_canary_could(
    cluster: Cluster,
    operator: OperatorProcess,
    engine: EngineKubelet,
    tap: subprocess.Popen[bytes],
    ports: dict[str, int],
) -> None:
    namespace = cluster.namespace
    cluster.apply(_spec(namespace, ports, "2s"))

    with Traffic(f"http://127.0.0.1:{ports['tap']}") as traffic:
        good = cluster.wait_baked()
        # The guard reads the tap in every round.
        scope = {"namespace": namespace, "deployment": "dsv4-flash"}
        # Live counts are on /metrics (status.guard has them as of its last write).
        wait_for(
            "traffic counted for the good revision",
            lambda: (
                (
                    operator.metric(
                        "dsv4_guard_window_samples", revision=good, source="traffic", **scope
                    )
                    or 0
                )
                > 0
            ),
            timeout=60,
        )
        assert scope in operator.series("dsv4_guard_taps_unreachable")
        assert operator.metric("dsv4_guard_taps_unreachable", **scope) == 0
        # The canary's series show which revisions it has answers for: the good one, now.
        assert good in {s["revision"] for s in operator.series("dsv4_canary_responses_total")}
        leaking = {
            "engine.indexKDtype": "bf16",
            "engine.hicache": {"enabled": True},
            "engine.capabilities": ["bf16IndexK", "poolSizingFix"],
            "safety.policy": "Warn",
        }
        far = _interval_with_no_canary_run_soon((namespace, "dsv4-flash"))
        cluster.apply(_spec(namespace, ports, far, **leaking))
        wait_for(
            "the leaking revision to be served",
            lambda: engine.env.get("SGLANG_DSV4_BF16_INDEX_K") == "1",
            timeout=120,
        )
        served_at = time.monotonic()

        canary_revisions: set[str] = set()

        def rolled_back() -> dict[str, Any] | None:
            # Every revision the canary has counted responses for, seen while waiting.
            canary_revisions.update(
                s["revision"] for s in operator.series("dsv4_canary_responses_total")
            )
            obj = cluster.get()
            return obj if obj.get("status", {}).get("quarantine") else None

        obj = wait_for("a rollback on the traffic signal", rolled_back, timeout=240)
        decided_after = time.monotonic() - served_at
    status = obj["status"]
    [entry] = status["quarantine"]
    print(
        f"rolled back {decided_after:.1f}s after the leaking revision was served: "
        f"{entry['message']}; traffic sent {traffic.sent}, failed {traffic.failed}"
    )
    assert entry["reason"] == "LeakRate" and entry["hash"] != good
    assert entry["message"].startswith("production traffic: ")
    # The canary could not have decided: it never ran against the leaking revision (its next
    # run was at least 10 minutes away), so the decision is the traffic's alone.
    assert entry["hash"] not in canary_revisions
    wait_good_revision_served(cluster, engine, good)
    # Nothing else changed: the user's spec is as applied, one rollback, one quarantine entry.
    final = cluster.get()
    assert final["spec"]["engine"]["indexKDtype"] == "bf16"
    assert [q["hash"] for q in final["status"]["quarantine"]] == [entry["hash"]]
    assert sum(1 for e in cluster.events() if e["reason"] == "RolledBack") == 1
    assert tap.poll() is None  # the tap served throughout


class MetricsReads:
    """The tap's /metrics passed through unchanged, noting when each read began: the test
    knows when the operator read the tap."""

    def __init__(self, port: int, target: str) -> None:
        reads: list[float] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                reads.append(time.monotonic())
                with urllib.request.urlopen(target, timeout=5) as reply:
                    body = reply.read()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.reads, self.url = reads, f"http://127.0.0.1:{port}/metrics"
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def read_after(self, moment: float, timeout: float = 90) -> float:
        """Until a read began after `moment`; when it began."""
        return float(
            wait_for(
                "a read of the tap",
                lambda: next((r for r in self.reads if r > moment), None),
                timeout=timeout,
            )
        )


@pytest.fixture
def reads(ports: dict[str, int]) -> Iterator[MetricsReads]:
    relay = MetricsReads(ports["reads"], f"http://127.0.0.1:{ports['tap_metrics']}/metrics")
    yield relay
    relay.server.shutdown()


def _answered(url: str, count: int) -> None:
    """`count` tool-calling requests through the tap, one after another, each answered."""
    with httpx.Client(timeout=30) as client:
        for _ in range(count):
            reply = client.post(f"{url}/v1/chat/completions", json=tool_calling_request())
            assert reply.status_code == 200


READ_INTERVAL = 40  # seconds: longer than the rollout below


@pytest.mark.long(seconds=90)
def test_a_rollout_shorter_than_the_read_interval_charges_no_earlier_answer_to_the_new_revision(
    cluster: Cluster,
    operator: OperatorProcess,
    engine: EngineKubelet,
    tap: subprocess.Popen[bytes],
    reads: MetricsReads,
    ports: dict[str, int],
) -> None:
    namespace = cluster.namespace
    scope = {"namespace": namespace, "deployment": "dsv4-flash"}
    tap_url = f"http://127.0.0.1:{ports['tap']}"
    slow_reads = {"guard.tap": {"interval": f"{READ_INTERVAL}s", "metricsEndpoints": [reads.url]}}
    cluster.apply(_spec(namespace, ports, "10m", **slow_reads))
    first = cluster.wait_phase("Ready", timeout=180)["status"]["currentRevision"]
    # kwok marks the pods Ready at once; the double behind the tap starts a moment later.
    engine.wait_answering("--max-running-requests")
    # Right after a read of the tap with the first revision served alone and settled, it
    # answers some requests, then a rollout to a second revision ends before the next read.
    read = reads.read_after(time.monotonic())
    before_change = 20
    _answered(tap_url, before_change)
    cluster.apply(_spec(namespace, ports, "10m", **slow_reads, **{"engine.maxRunningRequests": 48}))

    def second_served() -> str | None:
        status = cluster.get().get("status", {})
        current = status.get("currentRevision")
        return current if status.get("phase") == "Ready" and current != first else None

    second = str(wait_for("the second revision served", second_served, timeout=120))
    settled = time.monotonic()
    print(f"the rollout settled {settled - read:.1f}s after the read before it")
    assert settled - read < READ_INTERVAL, "the rollout took longer than the read interval"

    def charged_to_second() -> int:
        # Live, on /metrics: status.guard has the window's counts as of its last write.
        traffic = {"revision": second, "source": "traffic", **scope}
        return int(operator.metric("dsv4_guard_window_samples", **traffic) or 0)

    def unattributed() -> float:
        return operator.metric("dsv4_guard_traffic_unattributed_total", **scope) or 0

    # The answers before the change were read once the rollout had begun: counted apart, or
    # (before this was fixed) at the next read, for the second revision.
    wait_for(
        "the answers before the change read",
        lambda: unattributed() + charged_to_second() >= before_change,
        timeout=READ_INTERVAL + 60,
    )
    assert charged_to_second() == 0
    assert unattributed() == before_change
    # The second revision's own answers count for it, from the read taken as it settled.
    reads.read_after(settled)
    engine.wait_answering("--max-running-requests 48")  # restarted for the second revision
    after_change = 10
    _answered(tap_url, after_change)
    wait_for(
        "the second revision's answers counted",
        lambda: charged_to_second() == after_change,
        timeout=READ_INTERVAL + 60,
    )
    assert unattributed() == before_change

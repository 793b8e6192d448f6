"""A hostile object at every maximum the CRD allows cannot starve the operator.

Two objects push the operator's work per object to the schema's limits at once: "wide" with
128 prefill + 128 decode + 32 router replicas (every pod Pending: 288 pods whose events the
operator watches), and "loud" with the largest canary (64 sessions x 16 rounds) at the
operator's shortest interval, probing the engine test double. Meanwhile a third, ordinary
object is changed three times. Stated bounds (docs/security.md#bounds):

- the operator's resident memory stays under MEMORY_BUDGET_MB;
- each change of the ordinary object reaches its StatefulSet within CHANGE_BOUND_SECONDS.

Both bounds are generous against what is measured on a quiet machine (printed by the test):
they catch unbounded work (the 2.9 GB and 20-90 s of an unbounded object), not slowness.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import POOL_LABEL, Cluster, example, rtx_pool, weights_volume
from dsv4_devcluster.operator import OperatorProcess
from dsv4_engine_double.process import DoubleProcess, launch_from_statefulset
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.children import render_spec

pytestmark = pytest.mark.integration

MEMORY_BUDGET_MB = 300
CHANGE_BOUND_SECONDS = 30
HOSTILE_POOL = "hostile"


@pytest.fixture(scope="module")
def hostile_pool(control_plane: ControlPlane, dsv4_crd: dict[str, Any]) -> list[str]:
    return rtx_pool(control_plane, "hostile-rtx", 2, HOSTILE_POOL)


def _pinned(namespace: str, name: str, pool: str, **changes: Any) -> dict[str, Any]:
    doc = example(namespace, name=name, **changes)
    for role in ("prefill", "decode"):
        doc["spec"][role]["nodeSelector"] = {POOL_LABEL: pool}
    return doc


@pytest.fixture
def double(namespace: str) -> Iterator[DoubleProcess]:
    """The engine test double behind the loud object's canary (a real HTTP server)."""
    spec = DSV4DeploymentSpec.model_validate(example(namespace)["spec"])
    decode = next(
        c
        for c in render_spec("loud", namespace, spec)
        if c["kind"] == "StatefulSet" and c["metadata"]["name"] == "loud-decode"
    )
    args, env = launch_from_statefulset(decode, spec.engine.capabilities)
    with DoubleProcess(args, env) as process:
        yield process


class RssSampler:
    """Samples the operator's VmRSS every 0.5 s in a thread until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kb = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                text = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return
            for line in text.splitlines():
                if line.startswith("VmRSS:"):
                    self.peak_kb = max(self.peak_kb, int(line.split()[1]))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _decode_command(cluster: Cluster, name: str) -> list[str]:
    sts = cluster.children(name).get(("StatefulSet", f"{name}-decode"))
    if sts is None:
        return []
    return list(sts["spec"]["template"]["spec"]["containers"][0]["command"])


@pytest.mark.long(seconds=45)
def test_a_hostile_object_cannot_starve_the_operator(
    control_plane: ControlPlane,
    dyn: Any,
    namespace: str,
    tmp_path: Path,
    hostile_pool: list[str],
    double: DoubleProcess,
) -> None:
    weights_volume(dyn, namespace)
    cluster = Cluster(dyn, namespace)
    operator = OperatorProcess(
        control_plane.kubeconfig_path,
        namespace,
        tmp_path,
        DSV4_CANARY_ENDPOINT_ALLOW=double.url,
    ).start()
    assert operator.proc is not None
    try:
        with RssSampler(operator.proc.pid) as rss:
            cluster.apply(_pinned(namespace, "victim", HOSTILE_POOL, guard={"enabled": False}))
            cluster.apply(
                _pinned(
                    namespace,
                    "loud",
                    HOSTILE_POOL,
                    guard={
                        "canary": {
                            "sessions": 64,
                            "rounds": 16,
                            "interval": "10s",
                            "endpoint": double.url,
                        },
                    },
                )
            )
            cluster.wait_phase("Ready", name="victim")
            cluster.wait_phase("Ready", name="loud")
            cluster.apply(
                _pinned(
                    namespace,
                    "wide",
                    "nowhere",
                    **{"prefill.replicas": 128, "decode.replicas": 128, "router.replicas": 32},
                )
            )
            wait_for(
                "the wide object's 288 pods",
                lambda: len(cluster.pods("dsv4.io/deployment=wide")) >= 288,
                timeout=180,
            )
            wait_for(
                "the loud canary's first run",
                lambda: (operator.metric("dsv4_canary_responses_total") or 0) > 0,
                timeout=180,
            )
            latencies = []
            for requests in (48, 40, 32):
                started = time.monotonic()
                cluster.apply(
                    _pinned(
                        namespace,
                        "victim",
                        HOSTILE_POOL,
                        guard={"enabled": False},
                        **{"engine.maxRunningRequests": requests},
                    )
                )

                def applied(value: int = requests) -> bool:
                    command = _decode_command(cluster, "victim")
                    return "--max-running-requests" in command and command[
                        command.index("--max-running-requests") + 1
                    ] == str(value)

                wait_for("the victim's change", applied, timeout=120)
                latencies.append(time.monotonic() - started)
            responses = operator.metric("dsv4_canary_responses_total") or 0
    finally:
        operator.stop()
    peak_mb = rss.peak_kb / 1024
    print(
        f"hostile objects: operator peak RSS {peak_mb:.0f} MB (budget {MEMORY_BUDGET_MB}); "
        f"victim change latencies {[round(s, 2) for s in latencies]} s "
        f"(bound {CHANGE_BOUND_SECONDS}); loud canary responses {responses:.0f}"
    )
    wide = cluster.children("wide")
    assert wide[("StatefulSet", "wide-decode")]["spec"]["replicas"] == 128
    assert responses > 0
    assert peak_mb < MEMORY_BUDGET_MB
    assert max(latencies) < CHANGE_BOUND_SECONDS

"""A real Prometheus (Debian's) scrapes the operator, a `dsv4 tap` in front of the engine
double and the double's /metrics, as the chart's and the operator's ServiceMonitors would have
prometheus-operator scrape them, and evaluates the chart's alert rules (durations scaled, see
prometheus_support): the series join, the dashboard's queries return data, and alerts fire and
resolve from what the exporters really export.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import Cluster, example, rtx_pool, weights_volume
from dsv4_devcluster.kubelet import report_container_terminated, report_pod_ip
from dsv4_devcluster.process import spawned_children
from dsv4_devcluster.prometheus import PrometheusProcess
from dsv4_operator import series
from dsv4_operator.api.limits import ENGINE_PORT
from tests.support.series import operator_families, tap_families

from ..chart.support import metric_names, tool
from .cluster_support import new_namespace, statefulset_policy
from .guard_support import Traffic, guard_operator, tap_ports
from .prometheus_support import (
    SCALE,
    Stack,
    alert_names,
    dashboard_queries,
    deployment_jobs,
    operator_job,
    scaled_rules,
    variable_queries,
)

# One stack (operator, engine double, tap, Prometheus, a baked deployment) per worker for the
# module (see `Stack`); `make test-integration` runs a module's tests on one worker
# (`--dist loadscope`, conftest), so the stack is set up once.
pytestmark = [pytest.mark.integration]

# Every alert of the rules file: the test here that drives it to fire and to resolve from real
# series, or why none does yet.
DRIVEN = {
    "DSV4LeakRateHigh": "test_series_join_dashboards_fill_and_leak_alerts_fire_and_resolve",
    "DSV4RollbackPerformed": "test_rollback_quarantine_tap_and_operator_alerts_fire_and_resolve",
    "DSV4ConfigQuarantined": "test_rollback_quarantine_tap_and_operator_alerts_fire_and_resolve",
    "DSV4LeakTapUnreachable": "test_rollback_quarantine_tap_and_operator_alerts_fire_and_resolve",
    "DSV4OperatorDown": "test_rollback_quarantine_tap_and_operator_alerts_fire_and_resolve",
    "DSV4GuardBlind": "test_guard_blind_and_canary_not_running_fire_while_the_engine_is_gone_"
    "and_resolve",
    "DSV4CanaryNotRunning": "test_guard_blind_and_canary_not_running_fire_while_the_engine_is_"
    "gone_and_resolve",
    "DSV4GuardNoData": "test_guard_no_data_fires_while_windows_end_without_a_verdict_and_resolves",
    "DSV4KVTransferFailures": "test_kv_transfer_alerts_fire_from_the_engines_relabelled_series_"
    "and_resolve",
    "DSV4KVIntegrity": "test_kv_transfer_alerts_fire_from_the_engines_relabelled_series_and_"
    "resolve",
    "DSV4KVBootstrapFailures": "test_kv_transfer_alerts_fire_from_the_engines_relabelled_series_"
    "and_resolve",
    "DSV4EagerDecodeFallback": "test_eager_decode_fallback_fires_when_batches_outgrow_the_cuda_"
    "graphs_and_resolves",
    "DSV4OOMEvents": "test_oom_and_reconcile_error_alerts_fire_and_resolve",
    "DSV4ReconcileErrors": "test_oom_and_reconcile_error_alerts_fire_and_resolve",
    "DSV4KVPoolPressure": "test_kv_pool_pressure_fires_while_the_pool_is_full_and_resolves",
    "DSV4LeakTapDropping": "test_tap_dropping_fires_while_its_classifier_crash_loops_and_resolves",
    "DSV4GuardReadsQueued": "test_guard_reads_queued_fires_while_engine_reads_hold_the_one_slot_"
    "and_resolves",
}
# An alert no test here can drive yet, with why (none today: a new alert must join one side).
NOT_DRIVEN: dict[str, str] = {}

NAME = "dsv4-flash"
LEAKING = {
    "engine.indexKDtype": "bf16",
    "engine.hicache": {"enabled": True},
    "engine.capabilities": ["bf16IndexK", "poolSizingFix"],
    "safety.policy": "Warn",
}


def _spec(namespace: str, ports: dict[str, int], **changes: Any) -> Any:
    """The deployment under test: its ServiceMonitor on, a canary every 2s, the taps read each
    second. The guard's own threshold is far above the double's 4.55% leak, so it never rolls
    back and the alerts (at their 2%) are what the test watches."""
    guard = {
        "enabled": True,
        "canary": {
            "enabled": True,
            "sessions": 8,
            "rounds": 4,
            "interval": "2s",
            "endpoint": f"http://127.0.0.1:{ports['engine']}",
        },
        "tap": {
            "interval": "1s",
            "metricsEndpoints": [f"http://127.0.0.1:{ports['tap_metrics']}/metrics"],
        },
        "leakRate": {"threshold": 0.5, "minSamples": 30, "confidence": 0.99},
        "bakeTime": "5s",
    }
    monitoring = {"serviceMonitor": {"enabled": True}}
    return example(namespace, **{"guard": guard, "monitoring": monitoring, **changes})


@pytest.fixture(scope="module")
def stack(
    control_plane: ControlPlane, dyn: Any, dsv4_crd: dict[str, Any], tmp_path_factory: Any
) -> Iterator[Stack]:
    """The module's one deployment (see `Stack`), started once per worker, healthy."""
    rtx_pool(control_plane, "prom-rtx", 2)
    log_dir = tmp_path_factory.mktemp("prometheus-stack")
    ports = tap_ports()
    with new_namespace(dyn, f"prometheus-{uuid.uuid4().hex[:6]}") as namespace:
        weights_volume(dyn, namespace)
        # Reconcile retries back off no longer than the rules' windows allow, scaled as they are.
        backoff = {"DSV4_RETRY_BACKOFF_MAX_SECONDS": str(300 // SCALE)}
        op = guard_operator(control_plane.kubeconfig_path, namespace, log_dir, ports, **backoff)
        served = Stack(Cluster(dyn, namespace), op, ports, _spec(namespace, ports), log_dir)
        jobs = [
            operator_job(op.metrics_port),
            *deployment_jobs(
                served.healthy["spec"],
                namespace,
                NAME,
                f"127.0.0.1:{ports['engine']}",
                f"127.0.0.1:{ports['tap_metrics']}",
            ),
        ]
        workdir = log_dir / "prometheus"
        workdir.mkdir()
        rules = [scaled_rules(workdir / "dsv4.rules.yaml")]
        try:
            served.prom = PrometheusProcess(tool("prometheus"), workdir, jobs, rules).start()
            # Baked, and every alert its first scrapes raise (the operator not up yet, say) over.
            served.restore(log_dir)
            yield served
        finally:
            if served.prom is not None:
                served.prom.stop()
            served.close()


@pytest.fixture
def served(stack: Stack, tmp_path: Path) -> Iterator[Stack]:
    """The module's stack, proved healthy before the test and restored after it."""
    stack.check_healthy()
    yield stack
    try:
        stack.restore(tmp_path)
    finally:
        assert stack.prom is not None
        print(f"--- operator log ({stack.operator.log_path}) ---\n{stack.operator.log_tail(60)}")
        print(f"--- prometheus log ---\n{stack.prom.log_tail(20)}")


def _unpack(
    served: Stack,
) -> tuple[Cluster, PrometheusProcess, dict[str, int], dict[str, str]]:
    """The deployment's cluster, Prometheus, the ports, and the deployment's SCOPE labels."""
    assert served.prom is not None
    scope = {"namespace": served.cluster.namespace, "deployment": NAME}
    return served.cluster, served.prom, served.ports, scope


def test_every_alert_is_driven_here_or_says_why_not() -> None:
    tests = {name for name in globals() if name.startswith("test_")}
    assert set(DRIVEN.values()) <= tests
    assert set(DRIVEN) | set(NOT_DRIVEN) == set(alert_names())
    assert not set(DRIVEN) & set(NOT_DRIVEN)


def _firing(prom: PrometheusProcess, alert: str, **labels: str) -> list[dict[str, Any]]:
    return [
        a
        for a in prom.alerts()
        if a["labels"]["alertname"] == alert
        and a["state"] == "firing"
        and labels.items() <= a["labels"].items()
    ]


@pytest.mark.long(seconds=95)
def test_series_join_dashboards_fill_and_leak_alerts_fire_and_resolve(
    served: Stack,
) -> None:
    cluster, prom, ports, scope = _unpack(served)
    engine = served.engine
    namespace = cluster.namespace
    cluster.apply(_spec(namespace, ports))
    good = cluster.wait_baked()
    for name, health, error in prom.rule_health():
        assert health in ("ok", "unknown"), (name, error)

    # 1. No leak yet: the canary-or-traffic alert is quiet, the rollback and OOM panels read 0
    # (not "No data") before their first event.
    wait_for("the operator's series scraped", lambda: prom.query("dsv4_revision_info"), 60)
    assert not _firing(prom, "DSV4LeakRateHigh")
    for title, expr in dashboard_queries({**scope, "role": "decode"}):
        if title in ("Rollbacks", "OOM events by role"):
            values = {float(s["value"][1]) for s in prom.query(expr)}
            assert values == {0.0}, (title, expr, values)

    # 2. A leaking revision (the double's 4.55% under load), no production traffic: the
    # canary's leak rate decides, with the revision it is about.
    cluster.apply(_spec(namespace, ports, **LEAKING))
    wait_for(
        "the leaking revision served",
        lambda: engine.env.get("SGLANG_DSV4_BF16_INDEX_K") == "1",
        timeout=120,
    )
    bad = str(wait_for("the leaking revision current", lambda: cluster.get()["status"].get(
        "currentRevision") if cluster.get()["status"].get("currentRevision") != good else None,
        timeout=120))  # fmt: skip
    canary = wait_for(
        "DSV4LeakRateHigh from the canary",
        lambda: _firing(prom, "DSV4LeakRateHigh", source="canary", revision=bad, **scope),
        timeout=180,
    )
    print(f"canary alert: {canary[0]['labels']} value {canary[0]['value']}")

    with Traffic(f"http://127.0.0.1:{ports['tap']}") as traffic:
        # 3. Production traffic through the tap: at 200 responses in the (scaled) window it
        # decides, and the canary branch of the same deployment stands down: the `unless on
        # (namespace, deployment)` join matches the tap's series to the operator's.
        wait_for(
            "DSV4LeakRateHigh from production traffic",
            lambda: _firing(prom, "DSV4LeakRateHigh", source="traffic", **scope),
            timeout=180,
        )
        wait_for(
            "the canary branch suppressed by the traffic of the same deployment",
            lambda: (
                not [
                    a
                    for a in prom.alerts()
                    if a["labels"]["alertname"] == "DSV4LeakRateHigh"
                    and a["labels"].get("source") == "canary"
                ]
            ),
            timeout=60,
        )
        _assert_every_family_has_the_vocabulary(prom)
        _assert_the_series_join(prom, scope)
        _assert_every_dashboard_query_returns_data(prom, scope)

        # 4. The good configuration again: traffic and canary clean, the alert resolves.
        cluster.apply(_spec(namespace, ports))
        wait_for(
            "the good revision served",
            lambda: engine.env.get("SGLANG_DSV4_BF16_INDEX_K") == "0",
            timeout=120,
        )
        wait_for(
            "DSV4LeakRateHigh resolved",
            lambda: (
                not [a for a in prom.alerts() if a["labels"]["alertname"] == "DSV4LeakRateHigh"]
            ),
            timeout=30 * 60 // SCALE + 120,
        )
    print(f"traffic sent {traffic.sent}, failed {traffic.failed}")


def _assert_every_family_has_the_vocabulary(prom: PrometheusProcess) -> None:
    """What Prometheus stores for each family is what the exporter declares, with the scrape's
    own target labels: a family that drifts from the vocabulary (loses `namespace`, gains an
    `exported_namespace`, spells the deployment `ns/name`) fails here."""
    target_labels = {"instance", "job", "namespace", "pod", "service", "endpoint"}
    for exporter, families in (("operator", operator_families()), ("tap", tap_families())):
        for family, labels in families.items():
            metric = f"{family}_count" if family.endswith("_seconds") else family
            stored = prom.label_names(metric)
            if not stored:
                continue  # no sample yet (a labelled family before its first event)
            assert stored - target_labels - set(labels) <= {"le"}, (exporter, family, stored)
            assert not {n for n in stored if n.startswith("exported_")}, (family, stored)
            if set(series.SCOPE) <= set(labels):
                assert set(series.SCOPE) <= stored, (family, stored)


def _assert_the_series_join(prom: PrometheusProcess, scope: dict[str, str]) -> None:
    """The operator's, the tap's and the engines' series of one deployment meet on SCOPE."""
    on = ", ".join(series.SCOPE)
    joins = {
        "tap x operator": f"sum by ({on}) (dsv4_traffic_responses_total) * on ({on}) "
        f"group_left max by ({on}) (dsv4_revision_info)",
        "engine x operator": f"max by ({on}) (sglang:token_usage) * on ({on}) "
        f"group_left max by ({on}) (dsv4_revision_info)",
    }
    for what, expr in joins.items():
        result = prom.query(expr)
        assert [s["metric"] for s in result] == [scope], (what, result)


def _assert_every_dashboard_query_returns_data(
    prom: PrometheusProcess, scope: dict[str, str]
) -> None:
    for name, selector in variable_queries().items():
        selector = selector.replace("$namespace", scope["namespace"])
        values = {s["metric"].get(name) for s in prom.query(selector)}
        if name in scope:
            assert scope[name] in values, (name, values)
    # The engine double models the decode engine's counters the guard reads and the main
    # latency and load families, not all of SGLang's: a panel may be empty only because the
    # double exports none of the families it reads (the test prints which).
    stored = set(prom.api("label/__name__/values"))
    empty, unmodelled = [], set()
    for title, expr in dashboard_queries({**scope, "role": "decode"}):
        if not prom.query(expr):
            names = set(metric_names(expr))
            if names & stored or not all(n.startswith("sglang:") for n in names):
                empty.append((title, expr))
            unmodelled |= names
    assert not empty, "\n".join(f"{t}: {e}" for t, e in empty)
    print(f"panels left empty by families the double does not export: {sorted(unmodelled)}")


def _resolved(prom: PrometheusProcess, alert: str) -> bool:
    return not [a for a in prom.alerts() if a["labels"]["alertname"] == alert]


@pytest.mark.long(seconds=105)
def test_rollback_quarantine_tap_and_operator_alerts_fire_and_resolve(
    served: Stack,
    tmp_path: Path,
) -> None:
    cluster, prom, ports, scope = _unpack(served)
    namespace = cluster.namespace
    # The guard at the alert's own 2%: it rolls the leaking revision back.
    strict = {"guard.leakRate": {"threshold": 0.02, "minSamples": 30, "confidence": 0.99}}
    cluster.apply(_spec(namespace, ports, **strict))
    cluster.wait_baked()
    with Traffic(f"http://127.0.0.1:{ports['tap']}"):
        cluster.apply(_spec(namespace, ports, **strict, **LEAKING))
        wait_for(
            "DSV4RollbackPerformed",
            lambda: _firing(prom, "DSV4RollbackPerformed", reason="LeakRate", **scope),
            timeout=240,
        )
    wait_for("DSV4ConfigQuarantined", lambda: _firing(prom, "DSV4ConfigQuarantined", **scope), 60)

    # The tap stops: the guard counts it unreachable; back, and the alert resolves.
    served.stop_tap()
    wait_for(
        "DSV4LeakTapUnreachable",
        lambda: _firing(prom, "DSV4LeakTapUnreachable", **scope),
        timeout=10 * 60 // SCALE + 60,
    )
    served.start_tap(tmp_path)
    wait_for(
        "DSV4LeakTapUnreachable resolved",
        lambda: _resolved(prom, "DSV4LeakTapUnreachable"),
        timeout=60,
    )
    # The rollback leaves the (scaled) 15m window: resolved.
    wait_for(
        "DSV4RollbackPerformed resolved",
        lambda: _resolved(prom, "DSV4RollbackPerformed"),
        timeout=15 * 60 // SCALE + 60,
    )

    # The operator stops: nothing scrapes job dsv4-operator healthy; back, and it resolves.
    served.operator.stop()
    wait_for(
        "DSV4OperatorDown",
        lambda: _firing(prom, "DSV4OperatorDown"),
        timeout=5 * 60 // SCALE + 60,
    )
    served.operator.start()
    wait_for("DSV4OperatorDown resolved", lambda: _resolved(prom, "DSV4OperatorDown"), 60)

    # Deleted: every series of the deployment goes, and with them the quarantine alert (the
    # stack makes the deployment again after the test).
    cluster.dsv4.delete(name=NAME, namespace=namespace)
    wait_for(
        "DSV4ConfigQuarantined resolved",
        lambda: _resolved(prom, "DSV4ConfigQuarantined"),
        timeout=60,
    )


@pytest.mark.long(seconds=110)
def test_guard_blind_and_canary_not_running_fire_while_the_engine_is_gone_and_resolve(
    served: Stack,
    tmp_path: Path,
) -> None:
    """No tap runs (an unreachable tap does not blind the guard): the canary is the guard's
    only source, and with the engine gone no run completes. Both come back after."""
    cluster, prom, ports, scope = _unpack(served)
    namespace = cluster.namespace
    cluster.apply(_spec(namespace, ports))
    cluster.wait_baked()
    alerts = ("DSV4GuardBlind", "DSV4CanaryNotRunning")
    assert not [a for a in prom.alerts() if a["labels"]["alertname"] in alerts]
    served.stop_tap()
    served.engine.stop()
    for alert in alerts:
        wait_for(
            alert,
            functools.partial(_firing, prom, alert, **scope),
            timeout=(15 + 5) * 60 // SCALE + 90,
        )
    served.start_engine(tmp_path)
    for alert in alerts:
        wait_for(f"{alert} resolved", functools.partial(_resolved, prom, alert), 120)
    served.start_tap(tmp_path)


# An engine on 0.5.23, whose decode checksums the KV pages it receives (the double follows).
RELEASE_0_5_23 = {
    "engine.sglangVersion": "0.5.23",
    "engine.image": "registry.example.com/dsv4-engine:0.5.23-p1",
    "engine.capabilities": ["bf16IndexK", "poolSizingFix", "toolCallDropCounter"],
}


@pytest.mark.long(seconds=80)
def test_kv_transfer_alerts_fire_from_the_engines_relabelled_series_and_resolve(
    served: Stack,
) -> None:
    """The double fails 5% of its KV transfers (0.5.23's checksum, HTTP 500) and 2% of its PD
    bootstrap handshakes: the SGLang alerts fire with the deployment's labels, which only the
    ServiceMonitor's relabelling gives the engines' series; the configuration without the
    failures again, and they resolve."""
    cluster, _prom, ports, _scope = _unpack(served)
    cluster.apply(_spec(cluster.namespace, ports, **RELEASE_0_5_23))
    cluster.wait_baked()
    failing = {
        "engine.env": [
            {"name": "DSV4_DOUBLE_KV_CHECKSUM_MISMATCH_PROB", "value": "0.05"},
            {"name": "DSV4_DOUBLE_BOOTSTRAP_FAILURE_PROB", "value": "0.02"},
        ]
    }
    alerts = ("DSV4KVTransferFailures", "DSV4KVIntegrity", "DSV4KVBootstrapFailures")
    _engine_env_alerts_fire_and_resolve(served, failing, alerts, RELEASE_0_5_23)


def _engine_env_alerts_fire_and_resolve(
    served: Stack, faulty: dict[str, Any], alerts: tuple[str, ...], base: dict[str, Any]
) -> None:
    """Under traffic, the spec `base` plus `faulty` (engine.env knobs of the double): each of
    `alerts` fires on decode's series with the deployment's labels; `base` again, the double
    restarted without the knobs, and each resolves."""
    cluster, prom, ports, scope = _unpack(served)
    knobs = {(e["name"], e["value"]) for e in faulty["engine.env"]}
    with Traffic(f"http://127.0.0.1:{ports['tap']}"):
        cluster.apply(_spec(cluster.namespace, ports, **base, **faulty))
        for alert in alerts:
            wait_for(
                alert,
                functools.partial(_firing, prom, alert, job=f"{NAME}-decode", **scope),
                timeout=15 * 60 // SCALE + 120,
            )
        cluster.apply(_spec(cluster.namespace, ports, **base))
        wait_for(
            "the double without the knobs",
            lambda: not knobs & set(served.engine.env.items()),
            timeout=120,
        )
        for alert in alerts:
            wait_for(
                f"{alert} resolved",
                functools.partial(_resolved, prom, alert),
                timeout=10 * 60 // SCALE + 60,
            )


@pytest.mark.long(seconds=110)
def test_eager_decode_fallback_fires_when_batches_outgrow_the_cuda_graphs_and_resolves(
    served: Stack,
) -> None:
    """Decode's CUDA graphs captured up to 32 requests, the double serves 60 (rule DSV4-R006, a
    warning): every decode pass runs eager until the graphs cover the load again."""
    cluster, prom, ports, scope = _unpack(served)
    namespace = cluster.namespace
    small_graphs = {"decode.overrides": {"cudaGraphMaxBs": 32}}
    with Traffic(f"http://127.0.0.1:{ports['tap']}"):
        cluster.apply(_spec(namespace, ports, **small_graphs))
        wait_for(
            "DSV4EagerDecodeFallback",
            lambda: _firing(prom, "DSV4EagerDecodeFallback", job=f"{NAME}-decode", **scope),
            timeout=15 * 60 // SCALE + 120,
        )
        cluster.apply(_spec(namespace, ports))
        wait_for(
            "DSV4EagerDecodeFallback resolved",
            lambda: _resolved(prom, "DSV4EagerDecodeFallback"),
            timeout=10 * 60 // SCALE + 90,
        )


@pytest.mark.long(seconds=150)
def test_guard_no_data_fires_while_windows_end_without_a_verdict_and_resolves(
    served: Stack,
) -> None:
    """The canary answers, but the guard asks for more samples than it will see for a while:
    every window ends NoData until the bar is lowered."""
    cluster, prom, ports, scope = _unpack(served)
    namespace = cluster.namespace
    unreachable = {"guard.leakRate": {"threshold": 0.02, "minSamples": 100_000}}
    cluster.apply(_spec(namespace, ports, **unreachable))
    wait_for(
        "DSV4GuardNoData",
        lambda: _firing(prom, "DSV4GuardNoData", **scope),
        timeout=30 * 60 // SCALE + 120,
    )
    cluster.apply(_spec(namespace, ports))
    wait_for("DSV4GuardNoData resolved", lambda: _resolved(prom, "DSV4GuardNoData"), 120)


@pytest.mark.long(seconds=120)
def test_oom_and_reconcile_error_alerts_fire_and_resolve(served: Stack) -> None:
    """The kubelet reports the decode engine OOMKilled (the guard counts it), and an admission
    policy refuses the operator's StatefulSet writes while the spec asks for a change: each
    alert fires with the deployment's (or the operator pod's) labels, and resolves once the
    OOMs stop and the policy is lifted."""
    cluster, prom, ports, scope = _unpack(served)
    namespace = cluster.namespace
    cluster.apply(_spec(namespace, ports))
    cluster.wait_baked()
    assert not [a for a in prom.alerts() if a["labels"]["alertname"] == "DSV4ReconcileErrors"]
    report_container_terminated(
        cluster.dyn, namespace, f"{NAME}-decode-0", "engine", reason="OOMKilled", exit_code=137
    )
    lift = statefulset_policy(cluster.dyn, namespace, "false", "refused by the test")
    try:
        cluster.apply(_spec(namespace, ports, **{"engine.maxRunningRequests": 48}))
        wait_for(
            "DSV4OOMEvents",
            lambda: _firing(prom, "DSV4OOMEvents", role="decode", kind="OOMKilled", **scope),
            timeout=120,
        )
        wait_for(
            "DSV4ReconcileErrors",
            lambda: _firing(prom, "DSV4ReconcileErrors", pod="dsv4-operator-0"),
            timeout=(15 + 10) * 60 // SCALE + 90,
        )
    finally:
        lift()
    for alert in ("DSV4OOMEvents", "DSV4ReconcileErrors"):
        wait_for(
            f"{alert} resolved",
            functools.partial(_resolved, prom, alert),
            timeout=10 * 60 // SCALE + 90,
        )


@pytest.mark.long(seconds=90)
def test_kv_pool_pressure_fires_while_the_pool_is_full_and_resolves(
    served: Stack,
) -> None:
    """Engines whose KV pool holds 8 tokens, less than any one request (the double reports that
    capacity), under steady traffic: `sglang:token_usage` stays at 1 and DSV4KVPoolPressure
    fires with the labels the ServiceMonitor's relabelling gives; with the pool back to the
    plan's, it resolves.

    Requests are held ~1 s (the stack's double answers in 20 ms): the usage gauge is read at
    each scrape, and `for:` restarts on one scrape that finds all four clients between requests
    (at 20 ms a few percent of scrapes on a busy machine, enough to miss 20 in a row).
    """
    tiny_pool = {
        "engine.env": [
            {"name": "DSV4_DOUBLE_REPORTED_MAX_TOTAL_TOKENS", "value": "8"},
            {"name": "DSV4_DOUBLE_LATENCY_MS", "value": "1000"},
        ]
    }
    _engine_env_alerts_fire_and_resolve(served, tiny_pool, ("DSV4KVPoolPressure",), {})


@pytest.mark.long(seconds=120)
def test_tap_dropping_fires_while_its_classifier_crash_loops_and_resolves(
    served: Stack,
) -> None:
    """The tap's classifier process is killed each time the tap restarts it (a classifier
    that keeps dying, OOM-killed say): the tap forwards every response but leaves most without
    a verdict, and DSV4LeakTapDropping fires; the classifier left alone, it resolves."""
    cluster, prom, ports, scope = _unpack(served)
    cluster.apply(_spec(cluster.namespace, ports))
    cluster.wait_baked()
    assert served.tap is not None
    tap_pid = served.tap.pid
    crash_loop = threading.Event()

    def kill_classifiers() -> None:
        while not crash_loop.is_set():
            for pid in spawned_children(tap_pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_classifiers, daemon=True)
    with Traffic(f"http://127.0.0.1:{ports['tap']}") as traffic:
        killer.start()
        try:
            wait_for(
                "DSV4LeakTapDropping",
                lambda: _firing(prom, "DSV4LeakTapDropping", **scope),
                timeout=(15 + 10) * 60 // SCALE + 90,
            )
        finally:
            crash_loop.set()
            killer.join(10)
        wait_for(
            "DSV4LeakTapDropping resolved",
            lambda: _resolved(prom, "DSV4LeakTapDropping"),
            timeout=10 * 60 // SCALE + 90,
        )
    assert traffic.sent > 0 and traffic.failed == 0  # the relay never stopped


# A loopback address no other test listens on: engine pods given it read from a listener that
# never answers.
SILENT_ENGINE_IP = "127.0.0.77"


@contextlib.contextmanager
def _silent_engines(served: Stack) -> Iterator[None]:
    """The deployment's engine pods at an address that takes connections and never answers
    (a listener that accepts nothing: the kernel completes each connect, no byte comes back),
    as a dropped or hung engine port looks to the guard; their addresses restored after (the
    pods stay off kwok's stages, as after `report_container_terminated`)."""
    cluster = served.cluster
    pods = {
        name: cluster.dyn.resources.get(api_version="v1", kind="Pod")
        .get(name=name, namespace=cluster.namespace)
        .to_dict()["status"]["podIP"]
        for name in (f"{NAME}-prefill-0", f"{NAME}-decode-0")
    }
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((SILENT_ENGINE_IP, ENGINE_PORT))
        listener.listen(4096)
        try:
            for name in pods:
                report_pod_ip(cluster.dyn, cluster.namespace, name, SILENT_ENGINE_IP)
            yield
        finally:
            for name, ip in pods.items():
                report_pod_ip(cluster.dyn, cluster.namespace, name, ip)


@contextlib.contextmanager
def _operator_with(served: Stack, **env: str) -> Iterator[None]:
    """The stack's operator restarted with the settings `env`, and restarted without them
    after (its metrics port, so its Prometheus target, stays the same)."""
    op = served.operator
    op.stop()
    op.env.update(env)
    try:
        op.start()
        yield
    finally:
        op.stop()
        for key in env:
            del op.env[key]
        op.start()


@pytest.mark.long(seconds=90)
def test_guard_reads_queued_fires_while_engine_reads_hold_the_one_slot_and_resolves(
    served: Stack,
) -> None:
    """One read slot (DSV4_GUARD_READS_AT_ONCE=1) and the deployment's two engine pods at an
    address that never answers: each engine read holds the slot for its 2 s timeout, so every
    round's other read waits about that long for it, and the p90 of the waits the operator
    exports passes the rule's second. With the default slots and the engines' addresses back,
    the waits are short again and the alert resolves."""
    _, prom, _, _ = _unpack(served)
    alert = "DSV4GuardReadsQueued"
    assert _resolved(prom, alert)
    with _operator_with(served, DSV4_GUARD_READS_AT_ONCE="1"), _silent_engines(served):
        wait_for(
            alert,
            lambda: _firing(prom, alert, pod="dsv4-operator-0"),
            timeout=(15 + 10) * 60 // SCALE + 90,
        )
    wait_for(
        f"{alert} resolved",
        functools.partial(_resolved, prom, alert),
        timeout=10 * 60 // SCALE + 90,
    )

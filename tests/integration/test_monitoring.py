"""A ServiceMonitor asked for on a cluster without the prometheus-operator CRDs: a condition
and one Warning Event, and the rest of the deployment reconciled as usual (no error loop).

A control plane of its own, so no other test's CRDs (the chart tests install
prometheus-operator's) are there; no scheduler, so the engine pods stay Pending.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import Cluster, example
from dsv4_devcluster.operator import OperatorProcess
from tests.support.paths import CRD_PATH

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bare_plane() -> Iterator[ControlPlane]:
    with ControlPlane(crds=[CRD_PATH]) as cp:
        yield cp


def test_a_service_monitor_without_its_crd_is_a_condition_not_an_error_loop(
    bare_plane: ControlPlane, tmp_path: Path
) -> None:
    dyn = bare_plane.dynamic_client()
    namespace = f"monitoring-{time.monotonic_ns() % 10**8}"
    dyn.resources.get(api_version="v1", kind="Namespace").create(
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    operator = OperatorProcess(bare_plane.kubeconfig_path, namespace, tmp_path).start()
    cluster = Cluster(dyn, namespace)
    try:
        monitor: dict[str, Any] = {"monitoring.serviceMonitor": {"enabled": True}}
        cluster.apply(example(namespace, **monitor))

        def reported() -> dict[str, str] | None:
            conditions = cluster.get().get("status", {}).get("conditions", [])
            found = next((c for c in conditions if c["type"] == "MonitoringReady"), None)
            return found if found and found["status"] == "False" else None

        condition = wait_for("MonitoringReady=False", reported, timeout=60)
        assert condition["reason"] == "CRDMissing"
        assert "prometheus-operator" in condition["message"]
        # The rest is reconciled: every other child is there.
        kinds = {kind for kind, _ in cluster.children()}
        assert kinds == {"StatefulSet", "Deployment", "Service", "PodDisruptionBudget"}
        passes = (operator.metric("dsv4_reconciles_total") or 0) + 3
        wait_for(
            "three more passes",
            lambda: (operator.metric("dsv4_reconciles_total") or 0) >= passes,
            timeout=60,
        )
        events = cluster.wait_events("CRDMissing")
        assert sum(e.get("count", 1) for e in events if e["reason"] == "CRDMissing") == 1
        assert operator.metric("dsv4_reconciles_total", result="error") == 0
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.log_tail(40)}")
        dyn.client.close()

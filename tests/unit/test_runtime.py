"""The controller runtime's wiring: `build_operator` makes one fully wired Operator from the
settings without I/O, kube/ (the REST client) reaches metrics only through callbacks, and
kopf's private modules are imported in one file."""

from __future__ import annotations

import ast
from pathlib import Path

import kopf
import pytest
from kubernetes.config import kube_config

from dsv4_operator.kube.resources import DSV4
from dsv4_operator.runtime.lease import Timing
from dsv4_operator.runtime.metered import (
    CountedReconciler,
    count_list,
    count_request,
    count_watch_error,
)
from dsv4_operator.runtime.watched import WATCHED
from dsv4_operator.runtime.wiring import build_operator
from dsv4_operator.settings import OperatorSettings
from tests.support.paths import REPO

KUBE = REPO / "operator" / "dsv4_operator" / "kube"
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://kube.test:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def _kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's credentials from a kubeconfig (the kubernetes package read $KUBECONFIG
    when it was imported), never from the pod's service account."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


async def test_build_operator_wires_one_operator_from_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kubeconfig(tmp_path, monkeypatch)
    op = OperatorSettings(
        namespaces="a,b", workers=3, resync_seconds=7, leader_election=True, lease_name="l"
    )
    kopf_settings = kopf.OperatorSettings()

    operator = build_operator(op, kopf_settings)  # the unit tier refuses sockets and processes
    try:
        client, cache, queue = operator.client, operator.cache, operator.queue
        reconciler, guards, leadership = operator.reconciler, operator.guards, operator.leadership
        assert operator.settings is op and operator.leading is None  # built, not started
        assert client.on_request is count_request and client.field_manager == op.field_manager
        # The cache: every watched kind in the settings' namespaces, on kopf's settings.
        assert cache.settings is kopf_settings and cache.namespaces == ["a", "b"]
        assert cache.watched == list(WATCHED)
        assert len(kopf_settings.watching.label_selectors) == sum(
            1 for w in WATCHED if w.label_selector
        )
        assert (cache.on_list, cache.on_watch_error) == (count_list, count_watch_error)
        assert cache.discover is not None
        # The queue runs the counted reconciler, which reads the cache and writes with the client.
        assert isinstance(reconciler, CountedReconciler)
        assert queue._reconcile is reconciler
        assert (queue._workers, queue._resync) == (3, 7)
        assert reconciler.client is client and reconciler.cache is cache
        assert reconciler.reader is cache
        assert reconciler.observations is operator.observations
        # The guards read the cache, share the observations and wake the queue.
        assert guards.wake == queue.add and guards.client is cache
        assert guards.observations is operator.observations
        assert guards.policy == op.trust_policy
        # Leadership runs this queue and these guards while holding the settings' Lease.
        assert (leadership.cache, leadership.queue, leadership.guards) == (cache, queue, guards)
        elector = leadership.elector
        assert elector is not None and elector.client is client
        assert (elector.namespace, elector.name, elector.timing) == (
            op.lease_namespace,
            "l",
            Timing.for_duration(op.lease_duration_seconds),
        )
        # A change the cache sees enqueues its owner on this queue.
        assert cache.listener is not None
        cache.listener(DSV4, {"metadata": {"namespace": "a", "name": "d", "generation": 1}}, False)
        assert queue._queued == {("a", "d")}
    finally:
        await guards.close()
        await client.close()


async def test_without_leader_election_the_operator_always_leads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kubeconfig(tmp_path, monkeypatch)
    operator = build_operator(
        OperatorSettings(leader_election=False, namespaces=""), kopf.OperatorSettings()
    )
    try:
        assert operator.leadership.elector is None
        assert operator.cache.namespaces == [None]  # cluster-wide streams
    finally:
        await operator.guards.close()
        await operator.client.close()


def _imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def test_kube_never_imports_metrics() -> None:
    """kube/ is the REST client and its reads; what it counts reaches metrics.py as callbacks
    (the client's `on_request`), wired by the runtime."""
    files = sorted(KUBE.glob("*.py"))
    assert files
    for path in files:
        imported = _imported_modules(path)
        assert "dsv4_operator.metrics" not in imported, f"{path.name} imports metrics.py"


def test_kopf_private_modules_are_imported_in_one_file() -> None:
    """kopf's private streams are a pinned dependency with a reason; one file holds them."""
    product = REPO / "operator" / "dsv4_operator"
    importers = sorted(
        str(path.relative_to(product))
        for path in product.rglob("*.py")
        if any(m.startswith("kopf._cogs") for m in _imported_modules(path))
    )
    assert importers == ["runtime/kopf_streams.py"]

"""Integration fixtures: one real control plane per session, a fresh namespace per test, and a
second plane with the real LeaderWorkerSet controller (``lws_control_plane``) for the tests
that ask for it.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok) comes
from :mod:`dsv4_devcluster` (testsupport/); its binaries come from ``$KUBEBUILDER_ASSETS``, the
build cache, or ``tools/build-k8s.sh`` (minutes on a cold machine). If they can be neither
found nor built the fixture fails the tests: it never skips them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.operator import OperatorProcess
from tests.support.paths import CRD_PATHS

from .cluster_support import new_namespace
from .network_support import AddressWatch, host_addresses

_STARTUP_KEY = pytest.StashKey[float]()


@pytest.fixture(scope="session")
def _address_watch() -> Iterator[AddressWatch]:
    watch = AddressWatch()
    yield watch
    watch.stop()


@pytest.fixture(autouse=True)
def _no_address_on_a_host_interface(_address_watch: AddressWatch) -> Iterator[None]:
    """A test sends traffic only to loopback or into network namespaces it made itself
    (dsv4_devcluster.netns): one that adds an address to an interface the host had when the
    run began (lo, eth0), even for a moment, fails with the address named."""
    seen = len(_address_watch.added)
    yield
    now = host_addresses()
    left = {
        (name, address)
        for name, addresses in now.items()
        if name in _address_watch.before
        for address in addresses - _address_watch.before[name]
    }
    added = sorted(set(_address_watch.added[seen:]) | left)
    if added:
        pytest.fail(
            f"this test added addresses to host interfaces: {added}; give a pod its address "
            "in a network namespace of its own (dsv4_devcluster.netns.PodNetwork)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """The session's control plane, with kube-scheduler and kwok (fake GPU nodes).

    The DSV4Deployment CRD is installed before kube-controller-manager starts, so garbage
    collection of its children works at once (see ``ControlPlane.install_crds``).
    """
    cp = _started(ControlPlane(with_scheduler=True, with_kwok=True, crds=_dsv4_crds()))
    request.config.stash[_STARTUP_KEY] = cp.startup_seconds or 0.0
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def lws_control_plane() -> Iterator[ControlPlane]:
    """A control plane of its own with the real LeaderWorkerSet controller and its webhooks
    (``ControlPlane(with_lws=True)``, for multi-node roles), kube-scheduler, kwok and the
    DSV4Deployment CRD; started only by tests that use it, so the session's plane stays a
    cluster without LWS."""
    cp = _started(
        ControlPlane(with_scheduler=True, with_kwok=True, with_lws=True, crds=_dsv4_crds())
    )
    try:
        yield cp
    finally:
        cp.stop()


def _dsv4_crds() -> list[Path]:
    return [p for p in CRD_PATHS if p.is_file()]


def _started(cp: ControlPlane) -> ControlPlane:
    """``cp`` started, or the test failed with the reason (never skipped)."""
    error = ""
    try:
        cp.start()
    except Exception as exc:  # BinariesUnavailable, DevClusterError: fail, never skip
        error = f"could not start the dev control plane: {exc}"
    if error:
        pytest.fail(error, pytrace=False)
    return cp


@pytest.fixture(scope="session")
def dyn(control_plane: ControlPlane) -> Iterator[Any]:
    """A ``kubernetes.dynamic.DynamicClient`` with admin rights on the session cluster."""
    yield from _dynamic_client(control_plane)


@pytest.fixture(scope="session")
def lws_dyn(lws_control_plane: ControlPlane) -> Iterator[Any]:
    """A ``kubernetes.dynamic.DynamicClient`` with admin rights on the LWS control plane."""
    yield from _dynamic_client(lws_control_plane)


def _dynamic_client(cp: ControlPlane) -> Iterator[Any]:
    client = cp.dynamic_client()
    try:
        yield client
    finally:
        client.client.close()


@pytest.fixture
def namespace(dyn: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new namespace named after the test, with its default ServiceAccount in place."""
    yield from _test_namespace(dyn, request)


@pytest.fixture
def lws_namespace(lws_dyn: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """Like ``namespace``, on the LWS control plane."""
    yield from _test_namespace(lws_dyn, request)


def _test_namespace(dyn: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    with new_namespace(dyn, f"{slug}-{uuid.uuid4().hex[:6]}") as name:
        yield name


@pytest.fixture(scope="session")
def dsv4_crd(dyn: Any) -> dict[str, Any]:
    """The DSV4Deployment CRD (and the DSV4Model CRD beside it) from ``crds/``, applied
    server-side, Established and served."""
    applied = []
    for path in CRD_PATHS:
        assert path.is_file(), f"{path} is missing"
        applied.append(_apply_crd(dyn, yaml.safe_load(path.read_text())))
    return applied[0]


def _apply_crd(dyn: Any, crd: dict[str, Any]) -> dict[str, Any]:
    crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    crds.server_side_apply(body=crd, name=crd["metadata"]["name"], field_manager="dsv4-tests")
    kind = crd["spec"]["names"]["kind"]

    def established() -> bool:
        obj = crds.get(name=crd["metadata"]["name"]).to_dict()
        conditions = obj.get("status", {}).get("conditions", [])
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(f"{kind} CRD Established", established, timeout=60)
    # Served too (discovery refreshed), not only Established.
    wait_for(
        f"dsv4.io/v1alpha1 {kind} in discovery",
        lambda: _discoverable(dyn, "dsv4.io/v1alpha1", kind),
        timeout=60,
    )
    return crd


def _discoverable(dyn: Any, api_version: str, kind: str) -> bool:
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    try:
        dyn.resources.get(api_version=api_version, kind=kind)
    except ResourceNotFoundError:
        dyn.resources.invalidate_cache()
        return False
    return True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `long` first, the longest (`seconds`, as measured on 2 cores) first of all
    (a stable sort: the rest keep their order), so that under pytest-xdist they start at once
    on workers of their own instead of ending the run late. The tests of an `xdist_group`
    (a module whose tests share what they run against) sort as one, by their sum, and stay
    together: a worker then sets the shared part up once, not again after each other test."""

    def seconds(item: pytest.Item) -> float:
        marker = item.get_closest_marker("long")
        return float(marker.kwargs.get("seconds", 60)) if marker else 0.0

    groups: dict[str, float] = {}
    for item in items:
        if group := _group(item):
            groups[group] = groups.get(group, 0.0) + seconds(item)
    items.sort(key=lambda item: groups.get(_group(item), 0.0) or seconds(item), reverse=True)


def _group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", "")) if marker else ""


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    seconds = config.stash.get(_STARTUP_KEY, None)
    if seconds is not None:
        terminalreporter.write_line(
            f"devcluster: control plane (with scheduler + kwok) started in {seconds:.1f}s"
        )


@pytest.fixture
def operator(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Any]:
    """`dsv4 run` as a subprocess watching only the test's namespace (dsv4_devcluster.operator)."""
    op = OperatorProcess(control_plane.kubeconfig_path, namespace, tmp_path).start()
    yield op
    op.stop()
    # Captured output is shown only when the test fails.
    print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(80)}")


@pytest.fixture
def work_namespace(dyn: Any, namespace: str) -> Iterator[str]:
    """A second namespace for the DSV4Deployment (the `namespace` fixture holds the release)."""
    name = f"{namespace[:50]}-work"
    namespaces = dyn.resources.get(api_version="v1", kind="Namespace")
    namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    namespaces.delete(name=name)

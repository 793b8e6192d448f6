"""The watch cache against a real API server: server-side selection, changes, a watch gap,
and a genuine 410 Gone (watch cache off for Services, etcd compacted every second)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import auth
from kopf._cogs.structs import credentials

from dsv4_devcluster import ControlPlane
from dsv4_operator import metrics
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.resources import CONTROLLER_REVISION, POD, SERVICE, Resource
from dsv4_operator.names import DEPLOYMENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from dsv4_operator.pods import PodView
from dsv4_operator.runtime.cache import WatchCache, Watched
from dsv4_operator.runtime.metered import count_list, count_watch_error
from dsv4_operator.runtime.watched import STATEFULSET_REVISION_HASH_LABEL, WATCHED
from tests.support.polling import until

SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY},{DEPLOYMENT_LABEL}"
Change = tuple[str, str, bool]  # (name, resourceVersion, deleted)


async def _kopf_login(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> credentials.Vault:
    """What kopf's operator does before its tasks start: credentials into its vault."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    settings = kopf.OperatorSettings()
    info = kopf.login_with_kubeconfig(settings=settings)
    assert info is not None
    vault = credentials.Vault()
    await vault.populate({"test": info})
    auth.vault_var.set(vault)
    return vault


def _service(namespace: str, name: str, owned: bool = True, step: str = "0") -> dict[str, Any]:
    labels = {MANAGED_BY_LABEL: MANAGED_BY, DEPLOYMENT_LABEL: "d"} if owned else {"x": "y"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {"step": step},
        },
        "spec": {"clusterIP": "None", "ports": [{"port": 80}]},
    }


@pytest.fixture
async def client(control_plane: ControlPlane) -> AsyncIterator[KubeClient]:
    kube = KubeClient.from_environment(str(control_plane.kubeconfig_path))
    yield kube
    await kube.close()


def _cache(namespace: str, changes: list[Change], **watching: Any) -> WatchCache:
    settings = kopf.OperatorSettings()
    for key, value in watching.items():
        setattr(settings.watching, key, value)

    def listener(res: Resource, obj: dict[str, Any], deleted: bool, own: bool = False) -> None:
        meta = obj["metadata"]
        changes.append((meta["name"], meta.get("resourceVersion", ""), deleted))

    return WatchCache(
        settings,
        [Watched(SERVICE, label_selector=SELECTOR)],
        [namespace],
        listener,
        on_list=count_list,  # the operator's wiring (runtime/wiring.py)
        on_watch_error=count_watch_error,
    )


def _watch_errors() -> float:
    return float(metrics.WATCH_ERRORS.labels(SERVICE.plural)._value.get())


def _names(cache: WatchCache) -> set[str]:
    return {name for _, name in cache.keys(SERVICE)}


async def test_the_cache_follows_the_api_and_a_new_list_drops_what_went_away(
    control_plane: ControlPlane,
    namespace: str,
    client: KubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vault = await _kopf_login(control_plane.kubeconfig_path, monkeypatch)
    for name in ("a", "b", "c"):
        await client.create(_service(namespace, name))
    await client.create(_service(namespace, "foreign", owned=False))
    changes: list[Change] = []
    cache = _cache(namespace, changes)
    await cache.start()
    try:
        await cache.wait_synced()
        # Selected by the API server: the unlabelled Service never reaches the operator.
        assert _names(cache) == {"a", "b", "c"}
        assert cache.lists == 1
        await client.apply(_service(namespace, "b", step="1"))
        await until("b's change", lambda: ("b", False) in {(n, d) for n, _, d in changes[3:]})
        b = await cache.get(SERVICE, namespace, "b")
        assert b is not None and b["metadata"]["annotations"]["step"] == "1"
        assert "managedFields" not in b["metadata"]
        # Decoded from separate events, kept with one copy of each key and short string.
        c = await cache.get(SERVICE, namespace, "c")
        assert c is not None
        [b_labels] = [k for k in b["metadata"] if k == "labels"]
        [c_labels] = [k for k in c["metadata"] if k == "labels"]
        assert b_labels is c_labels
        assert (
            b["metadata"]["labels"][MANAGED_BY_LABEL] is c["metadata"]["labels"][MANAGED_BY_LABEL]
        )
        assert [
            o["metadata"]["name"]
            for o in await cache.list(SERVICE, namespace, {DEPLOYMENT_LABEL: "d"})
        ] == ["a", "b", "c"]
    finally:
        await cache.close()

    # The watch is down (as between a 410 Gone and the next list): a, c and e change unseen.
    await client.delete(SERVICE, namespace, "a")
    await client.apply(_service(namespace, "c", step="2"))
    await client.create(_service(namespace, "e"))
    changes.clear()
    await cache.start()
    try:
        await cache.wait_synced()
        assert _names(cache) == {"b", "c", "e"}
        c = await cache.get(SERVICE, namespace, "c")
        assert c is not None and c["metadata"]["annotations"]["step"] == "2"
        seen = {(name, deleted) for name, _, deleted in changes}
        assert seen == {("a", True), ("c", False), ("e", False)}, changes  # b did not change
        assert cache.lists == 2
    finally:
        await cache.close()
        await vault.close()


def _revision(namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {"spec": {"engine": {"image": "x"}}},
        "revision": 1,
    }


async def test_the_statefulset_controllers_revisions_are_not_cached(
    control_plane: ControlPlane,
    namespace: str,
    client: KubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator's watch of ControllerRevisions (runtime/watched.py): its own revisions,
    never the StatefulSet controller's, which carry the pod template's labels (ours) and the
    controller's hash label."""
    vault = await _kopf_login(control_plane.kubeconfig_path, monkeypatch)
    ours = {MANAGED_BY_LABEL: MANAGED_BY, DEPLOYMENT_LABEL: "d"}
    await client.create(_revision(namespace, "d-0123456789", ours))
    statefulsets = {**ours, STATEFULSET_REVISION_HASH_LABEL: "5696dc96c6"}
    await client.create(_revision(namespace, "d-decode-5696dc96c6", statefulsets))
    [watched] = [w for w in WATCHED if w.resource == CONTROLLER_REVISION]
    cache = WatchCache(kopf.OperatorSettings(), [watched], [namespace], lambda *_: None)
    await cache.start()
    try:
        await cache.wait_synced()
        assert cache.keys(CONTROLLER_REVISION) == [(namespace, "d-0123456789")]
    finally:
        await cache.close()
        await vault.close()


def _pod(namespace: str, name: str) -> dict[str, Any]:
    """An engine pod as a StatefulSet makes it: long containers, volumes and tolerations."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, DEPLOYMENT_LABEL: "d"},
        },
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "engine",
                    "image": "registry.example.com/sglang:v0.5.23",
                    "args": ["--model-path", "/models/dsv4", "--tp", "8"],
                    "env": [{"name": "SGLANG_DSV4_FP4_EXPERTS", "value": "1"}],
                    "volumeMounts": [{"name": "weights", "mountPath": "/models"}],
                }
            ],
            "volumes": [{"name": "weights", "emptyDir": {}}],
        },
    }


async def test_a_cached_pod_keeps_of_its_spec_only_what_the_pod_view_reads(
    control_plane: ControlPlane,
    namespace: str,
    client: KubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator's watch of pods (runtime/watched.py): every reader goes through PodView,
    so the containers, volumes and tolerations the API server sends are not kept, and the
    view of the cached pod is the view of the pod the API server holds (at the same version:
    the scheduler writes the pod's PodScheduled condition at a moment of its own)."""
    vault = await _kopf_login(control_plane.kubeconfig_path, monkeypatch)
    created = await client.create(_pod(namespace, "d-decode-0"))
    [watched] = [w for w in WATCHED if w.resource == POD]
    cache = WatchCache(kopf.OperatorSettings(), [watched], [namespace], lambda *_: None)
    await cache.start()
    seen: dict[str, Any] = {}

    async def same_version() -> bool:
        seen["held"] = await client.get(POD, namespace, "d-decode-0")
        seen["cached"] = await cache.get(POD, namespace, "d-decode-0")
        versions = [(seen[k] or {}).get("metadata", {}).get("resourceVersion") for k in seen]
        return versions[0] is not None and versions[0] == versions[1]

    try:
        await cache.wait_synced()
        await until("the cached pod at the API server's version", same_version)
        cached, held = seen["cached"], seen["held"]
    finally:
        await cache.close()
        await vault.close()
    assert cached is not None and held is not None
    assert {"containers", "volumes", "tolerations"} <= set(created["spec"])
    assert cached["spec"] == {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}
    assert (
        cached["status"] == held["status"]
        and cached["metadata"]["uid"] == created["metadata"]["uid"]
    )
    assert PodView.of(cached) == PodView.of(held)


@pytest.mark.long(seconds=40)
async def test_a_genuine_410_gone_relists_and_misses_no_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Services without the API server's watch cache, etcd compacted every second and watches
    that end every 2 s: resuming from a compacted version gets 410 Gone, so the cache lists
    again several times while Services come and go; it ends equal to a fresh LIST."""
    with ControlPlane(
        extra_apiserver_args={"watch-cache-sizes": "services#0", "etcd-compaction-interval": "1s"}
    ) as cp:
        namespace = f"gone-{uuid.uuid4().hex[:6]}"
        kube = KubeClient.from_environment(str(cp.kubeconfig_path))
        try:
            namespaces = cp.dynamic_client().resources.get(api_version="v1", kind="Namespace")
            namespaces.create(
                body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
            vault = await _kopf_login(cp.kubeconfig_path, monkeypatch)
            changes: list[Change] = []
            errors_before = _watch_errors()
            cache = _cache(namespace, changes, server_timeout=2)
            await cache.start()
            try:
                await cache.wait_synced()
                live: set[str] = set()
                step = 0
                # Bursts of changes, then quiet: while quiet, the stream's last version falls
                # behind the compaction (the controller-manager's lease renewals move etcd on),
                # so the reconnect every 2 s is answered 410 Gone; the next burst lands around
                # the new list.
                deadline = asyncio.get_running_loop().time() + 150
                while cache.lists < 4 or step < 30:
                    assert asyncio.get_running_loop().time() < deadline, (
                        f"only {cache.lists} list(s) after {step} changes"
                    )
                    for _ in range(5):
                        name = f"s{step % 7}"
                        if name in live:
                            await kube.delete(SERVICE, namespace, name)
                            live.discard(name)
                        else:
                            await kube.create(_service(namespace, name))
                            live.add(name)
                        step += 1
                        await asyncio.sleep(0.2)
                    await asyncio.sleep(4)
                listed = await kube.list(SERVICE, namespace, {MANAGED_BY_LABEL: MANAGED_BY})
                truth = {o["metadata"]["name"] for o in listed}
                assert truth == live
                await until("the cache to equal a fresh LIST", lambda: _names(cache) == truth)
                assert cache.lists >= 4  # the first list and at least three after 410 Gone
                assert _watch_errors() == errors_before  # each ended as a 410, not a failure
            finally:
                await cache.close()
                await vault.close()
        finally:
            await kube.close()


def _crd(group: str) -> dict[str, Any]:
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"probes.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "probes", "singular": "probe", "kind": "Probe"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def _install_then_create(control_plane: ControlPlane, crd_file: Path, obj: dict[str, Any]) -> None:
    control_plane.install_crds([crd_file])  # waits until Established
    dyn = control_plane.dynamic_client()
    try:
        dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).create(
            body=obj, namespace=obj["metadata"]["namespace"]
        )
    finally:
        dyn.client.close()


def _delete_crd(control_plane: ControlPlane, name: str) -> None:
    dyn = control_plane.dynamic_client()
    try:
        crds = dyn.resources.get(
            api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition"
        )
        crds.delete(name=name)
    finally:
        dyn.client.close()


async def test_an_optional_kind_installed_after_the_start_is_watched_within_seconds(
    control_plane: ControlPlane,
    namespace: str,
    client: KubeClient,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # As `helm install` does: the CRD comes with the operator, often after its first look.
    await _kopf_login(control_plane.kubeconfig_path, monkeypatch)
    group = f"t{uuid.uuid4().hex[:8]}.dsv4.test"
    probe = Resource(f"{group}/v1", "Probe", "probes")
    crd_file = tmp_path / "crd.yaml"
    crd_file.write_text(json.dumps(_crd(group)))  # JSON is YAML
    changes: list[Change] = []
    cache = WatchCache(
        kopf.OperatorSettings(),
        [Watched(probe, optional=True)],
        [namespace],
        lambda res, obj, deleted, own=False: changes.append((obj["metadata"]["name"], "", deleted)),
        discover=client.serves,
    )
    await cache.start()
    try:
        await cache.wait_synced()  # an absent kind counts as listed
        assert not await cache.serves(probe)
        obj = {"apiVersion": f"{group}/v1", "kind": "Probe",
               "metadata": {"name": "p", "namespace": namespace}}  # fmt: skip
        await asyncio.to_thread(_install_then_create, control_plane, crd_file, obj)
        # Looked for again 2, 4, 8 ... s apart: well within this (the fixed 300 s was not).
        await until("the new kind's object in the cache", lambda: ("p", "", False) in changes, 60)
        assert await cache.serves(probe)
        assert cache.keys(probe) == [(namespace, "p")]
    finally:
        await cache.close()
        await asyncio.to_thread(_delete_crd, control_plane, f"probes.{group}")

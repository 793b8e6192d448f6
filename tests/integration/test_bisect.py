"""Culprit bisection end to end (docs/bisect.md): real API server, the operator, and engine
doubles in place of the serving pair's pods (engine_support.PodEngines) and of every shadow
pair's (engine_support.ShadowEngines). The doubles leak only when a configured combination of
settings is present (DSV4_DOUBLE_LEAK_WHEN, testsupport/dsv4_engine_double/config.py), so the
culprit is known: the search must find exactly it, and the serving pair and its router must
see no write and no restart while it runs. The operator reaches each shadow pair through the
pair's own router Service, as a real PD pair is served (shadow_router_support.ShadowRouters
stands in for the router where kwok runs none), and the canary's requests must reach that
probe's shadow engines only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import Cluster, example
from dsv4_devcluster.operator import OperatorProcess
from dsv4_operator.api.limits import ENGINE_PORT
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.bisect import search
from dsv4_operator.render.context import build_context

from .engine_support import (
    PodEngines,
    ShadowEngines,
    cluster_fixture,
    gpu_pool_fixture,
    loopback_ips,
)
from .shadow_router_support import ShadowRouters

pytestmark = pytest.mark.integration

LEAK_RATE = "0.3"
# Three settings change between the good and the bad revision; the rules refuse none alone.
DELTA = {
    "engine.hicache": {"enabled": True},
    "engine.overlap.multiStream": True,
    "engine.cudaGraphMaxBs": 32,
}


gpu_pool = gpu_pool_fixture("bisect-rtx", 4, bisect_priority_class=True)
cluster = cluster_fixture()


@pytest.fixture
def ips() -> dict[str, str]:
    return loopback_ips()


@pytest.fixture
def routers(cluster: Cluster) -> Iterator[ShadowRouters]:
    with ShadowRouters(cluster) as proxy:
        yield proxy
    print(f"--- shadow routers refused: {proxy.refused[:10]}")


def _operator(
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    decode: str,
    routers: ShadowRouters,
) -> Any:
    # Service names go through the shadow routers' stand-in; the serving canary (its endpoint
    # the serving decode double's IP) goes direct.
    direct = f"{decode},127.0.0.1,localhost"
    return OperatorProcess(
        control_plane.kubeconfig_path,
        namespace,
        tmp_path,
        DSV4_CANARY_ENDPOINT_ALLOW=f"http://{decode}:30000",
        DSV4_MIN_CANARY_INTERVAL="1s",
        DSV4_BISECT_POLL_SECONDS="0.3",
        HTTP_PROXY=routers.url,
        http_proxy=routers.url,
        NO_PROXY=direct,
        no_proxy=direct,
    ).start()


@pytest.fixture
def operator(
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    ips: dict[str, str],
    routers: ShadowRouters,
) -> Iterator[OperatorProcess]:
    op = _operator(control_plane, namespace, tmp_path, ips["decode"], routers)
    yield op
    op.stop()
    print(f"--- operator log ({op.log_path}) ---\n{op.log_tail(80)}")


def _spec(namespace: str, endpoint: str, **changes: Any) -> Any:
    guard = {
        "enabled": True,
        "canary": {
            "enabled": True,
            "sessions": 16,
            "rounds": 4,
            "interval": "1s",
            "endpoint": endpoint,
        },
        "tap": {"enabled": False},
        "engine": {"enabled": False},
        "leakRate": {"threshold": 0.05, "minSamples": 30, "confidence": 0.99},
        "bakeTime": "3s",
        "bisect": {"enabled": True, "maxProbes": 12, "maxParallel": 2, "timeLimit": "10m"},
    }
    return example(namespace, **{"guard": guard, "safety.policy": "Warn", **changes})


def _serving(cluster: Cluster) -> dict[tuple[str, str], Any]:
    """The resourceVersion of every serving child the operator writes (the engine
    StatefulSets, the router Deployment, their Services and budgets), and each serving pod's
    uid and restart counts (the test's doubles and kwok write pod status, not the operator)."""
    versions: dict[tuple[str, str], Any] = {
        k: v["metadata"]["resourceVersion"] for k, v in cluster.children().items()
    }
    for pod in cluster.pods("dsv4.io/deployment=dsv4-flash"):
        restarts = [c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or []]
        versions[("Pod", pod["metadata"]["name"])] = (pod["metadata"]["uid"], restarts)
    return versions


def _rolled_back_and_settled(cluster: Cluster, good: str) -> None:
    wait_for(
        "the rollback to the good revision, settled",
        lambda: (lambda s: s.get("quarantine") and s.get("currentRevision") == good)(
            cluster.get().get("status", {})
        ),
        timeout=180,
    )


def _serving_good_again(engines: PodEngines, good: str) -> None:
    """Both roles' doubles run the good revision again (started a second time, after the bad
    one), so what follows starts no serving engine unless something restarts one."""
    wait_for(
        "the good revision's engines running again",
        lambda: all(
            sum(1 for _, r, rev in engines.launches if r == role and rev == good) >= 2
            for role in ("prefill", "decode")
        ),
        timeout=60,
    )


def _culprit(cluster: Cluster, timeout: float = 480) -> dict[str, Any]:
    # Returns once the search ends (90 s here when the machine is idle); a search on two
    # cores shared with three other control planes took over 240 s.
    found: dict[str, Any] = wait_for(
        "status.guard.culprit",
        lambda: (cluster.get().get("status", {}).get("guard") or {}).get("culprit"),
        timeout=timeout,
    )
    return found


def _bisected(cluster: Cluster) -> tuple[str, str]:
    """The Bisected condition's (status, reason)."""
    conditions = cluster.get()["status"]["conditions"]
    bisected = next(c for c in conditions if c["type"] == "Bisected")
    return bisected["status"], bisected["reason"]


def _through_shadow_routers(
    routers: ShadowRouters, answer: dict[str, Any], ips: dict[str, str]
) -> None:
    """Every probe that got answers got them through its own router, from its own engines."""
    routed = list(routers.routed)
    answered = {p["id"] for p in answer["probes"] if p["responses"]}
    assert answered, answer
    assert answered <= {r.probe for r in routed}, (answered, routed[:5])
    for r in routed:
        assert r.host == f"dsv4-flash-router-b{r.probe}.{routers.cluster.namespace}.svc:8000"
        assert r.router_pod.startswith(f"dsv4-flash-router-b{r.probe}-"), r
        assert r.prefill_pod == f"dsv4-flash-prefill-b{r.probe}-0", r
        assert r.decode_pod == f"dsv4-flash-decode-b{r.probe}-0", r
        assert r.decode_address.partition(":")[0] not in ips.values(), r


def _no_shadow_objects(cluster: Cluster) -> bool:
    """No shadow engine, router or Service left."""
    selector = "dsv4.io/shadow-of=dsv4-flash"
    return not any(
        cluster.items(api_version, kind, selector)
        for api_version, kind in (("apps/v1", "StatefulSet"), ("apps/v1", "Deployment"))
    ) and not cluster.items("v1", "Service", selector)


def _search(
    cluster: Cluster,
    engines: PodEngines,
    shadows: ShadowEngines,
    bad: dict[str, Any],
) -> tuple[dict[str, Any], str]:
    """Bake the good spec, apply the bad one, and wait for the search's answer; the serving
    pair and its router are compared before and after the search."""
    namespace = cluster.namespace
    cluster.apply(_spec(namespace, engines.url))
    good = cluster.wait_baked()
    cluster.apply(_spec(namespace, engines.url, **bad))
    _rolled_back_and_settled(cluster, good)
    _serving_good_again(engines, good)
    wait_for(
        "the search to start",
        lambda: (
            (cluster.get()["status"].get("guard") or {}).get("bisect")
            or (cluster.get()["status"].get("guard") or {}).get("culprit")
        ),
        timeout=60,
    )
    before, starts = _serving(cluster), engines.starts
    answer = _culprit(cluster)
    # The serving pair and its router: no write, no restart, during the whole search.
    assert _serving(cluster) == before
    assert engines.starts == starts
    assert shadows.pods_seen, "no shadow pair ran"
    wait_for("every shadow pair and router deleted", lambda: _no_shadow_objects(cluster), 60)
    return answer, good


@contextlib.contextmanager
def _doubles(
    cluster: Cluster, ips: dict[str, str], log_dir: Path, knobs: dict[str, str]
) -> Iterator[tuple[PodEngines, ShadowEngines]]:
    """Doubles for the serving pair's pods and for every shadow pair's, with `knobs`."""
    engines = PodEngines(cluster, ips, log_dir, knobs=knobs).start()
    try:
        with ShadowEngines(cluster, log_dir, knobs) as shadows:
            yield engines, shadows
    finally:
        engines.stop()


def _leaking(when: str) -> dict[str, str]:
    return {"DSV4_DOUBLE_LEAK_WHEN": when, "DSV4_DOUBLE_LEAK_RATE": LEAK_RATE}


@pytest.mark.long(seconds=90)
def test_a_single_setting_culprit_is_found_exactly(
    cluster: Cluster,
    operator: OperatorProcess,
    routers: ShadowRouters,
    ips: dict[str, str],
    tmp_path: Path,
) -> None:
    with _doubles(cluster, ips, tmp_path, _leaking("--enable-hierarchical-cache")) as doubles:
        answer, good = _search(cluster, *doubles, DELTA)
    print(answer)
    _through_shadow_routers(routers, answer, ips)
    assert answer["result"] == "Found", answer
    [setting] = answer["settings"]
    assert "hicache" in setting.lower()
    assert answer["goodRevision"] == good
    assert answer["release"] == "0.5.16"
    assert answer["gpuProduct"] == "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
    assert {p["outcome"] for p in answer["probes"]} >= {"pass", "fail"}
    for probe in answer["probes"]:
        assert probe["responses"] > 0
    reasons = [e["reason"] for e in cluster.events()]
    assert "BisectStarted" in reasons and "CulpritFound" in reasons
    assert _bisected(cluster) == ("True", "CulpritIdentified")


@pytest.mark.long(seconds=90)
def test_a_two_setting_interaction_is_found_as_the_pair(
    cluster: Cluster,
    operator: OperatorProcess,
    routers: ShadowRouters,
    ips: dict[str, str],
    tmp_path: Path,
) -> None:
    # Either setting alone is clean: only HiCache with multi-stream overlap leaks.
    pair = _leaking("--enable-hierarchical-cache,SGLANG_OPT_USE_MULTI_STREAM_OVERLAP=1")
    with _doubles(cluster, ips, tmp_path, pair) as doubles:
        answer, _ = _search(cluster, *doubles, DELTA)
    print(answer)
    _through_shadow_routers(routers, answer, ips)
    assert answer["result"] == "Found", answer
    assert len(answer["settings"]) == 2
    assert any("hicache" in s.lower() for s in answer["settings"])
    assert any("multistream" in s.lower() for s in answer["settings"])


@pytest.mark.long(seconds=90)
def test_a_leak_that_does_not_reproduce_blames_nothing(
    cluster: Cluster,
    operator: OperatorProcess,
    routers: ShadowRouters,
    ips: dict[str, str],
    tmp_path: Path,
) -> None:
    # The bad revision's serving engine leaks in its first requests only (noise), whatever
    # its settings; the shadow pairs never get the knob: the leak does not come back there.
    namespace = cluster.namespace
    bad_spec = _spec(namespace, f"http://{ips['decode']}:{ENGINE_PORT}", **DELTA)
    bad = build_context(
        "dsv4-flash", namespace, DSV4DeploymentSpec.model_validate(bad_spec["spec"])
    ).revision
    noise = {"DSV4_DOUBLE_LEAK_RATE": LEAK_RATE}
    engines = PodEngines(
        cluster, ips, tmp_path, knobs=noise, revision_knobs={bad: {"DSV4_DOUBLE_LEAK_FIRST": "400"}}
    ).start()
    try:
        with ShadowEngines(cluster, tmp_path, noise) as shadows:
            cluster.apply(_spec(namespace, engines.url))
            good = cluster.wait_baked()
            cluster.apply(bad_spec)
            _rolled_back_and_settled(cluster, good)
            answer = _culprit(cluster)
            assert shadows.pods_seen
    finally:
        engines.stop()
    print(answer)
    _through_shadow_routers(routers, answer, ips)
    assert answer["result"] == "NotReproduced", answer
    assert answer["settings"] == [] and answer["badRevision"] == bad
    [reproduce] = answer["probes"]  # the whole delta, clean on a shadow pair
    assert reproduce["outcome"] == "pass" and reproduce["leaks"] == 0
    assert "CulpritNotFound" in [e["reason"] for e in cluster.events()]
    assert _bisected(cluster) == ("False", "NotReproduced")


@pytest.mark.long(seconds=120)
def test_killing_the_operator_mid_search_resumes_it(
    control_plane: ControlPlane,
    cluster: Cluster,
    operator: OperatorProcess,
    routers: ShadowRouters,
    ips: dict[str, str],
    tmp_path: Path,
) -> None:
    with _doubles(cluster, ips, tmp_path, _leaking("--enable-hierarchical-cache")) as doubles:
        engines = doubles[0]
        namespace = cluster.namespace
        cluster.apply(_spec(namespace, engines.url))
        good = cluster.wait_baked()
        cluster.apply(_spec(namespace, engines.url, **DELTA))
        _rolled_back_and_settled(cluster, good)

        def probes_done() -> set[str] | None:
            bisect = (cluster.get()["status"].get("guard") or {}).get("bisect")
            if not bisect:
                return None
            stored = search.BisectState.model_validate(bisect["search"])
            return {p.probe_id for p in stored.probes if p.outcome is not None} or None

        done_before = wait_for("a first probe recorded", probes_done, timeout=120)
        operator.kill()
        restarted = _operator(control_plane, namespace, tmp_path, ips["decode"], routers)
        try:
            answer = _culprit(cluster)
        finally:
            restarted.stop()
            print(f"--- restarted operator log ---\n{restarted.log_tail(40)}")
    print(answer)
    assert answer["result"] == "Found", answer
    assert len(answer["settings"]) == 1 and "hicache" in answer["settings"][0].lower()
    # Resumed, not restarted: the probes recorded before the kill are part of the answer.
    recorded = {p["id"] for p in answer["probes"]}
    assert done_before <= recorded
    assert [e["reason"] for e in cluster.events()].count("BisectStarted") == 1


@pytest.mark.long(seconds=70)
def test_a_spec_change_stops_the_search_and_deletes_its_shadow_pairs(
    cluster: Cluster, operator: OperatorProcess, ips: dict[str, str], tmp_path: Path
) -> None:
    with _doubles(cluster, ips, tmp_path, _leaking("--enable-hierarchical-cache")) as doubles:
        engines = doubles[0]
        namespace = cluster.namespace
        cluster.apply(_spec(namespace, engines.url))
        good = cluster.wait_baked()
        cluster.apply(_spec(namespace, engines.url, **DELTA))
        _rolled_back_and_settled(cluster, good)
        wait_for(
            "a shadow pair",
            lambda: cluster.items("apps/v1", "StatefulSet", "dsv4.io/shadow-of=dsv4-flash"),
            timeout=60,
        )
        # The user fixes the spec: back to the good settings (a new generation).
        cluster.apply(_spec(namespace, engines.url))
        answer = _culprit(cluster, timeout=60)
        wait_for("every shadow pair and router deleted", lambda: _no_shadow_objects(cluster), 60)
    assert answer["result"] == "Stopped", answer
    assert answer["settings"] == [] and "the spec changed" in answer["message"]
    assert "bisect" not in cluster.get()["status"]["guard"]

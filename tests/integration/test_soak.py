"""Soak: the operator killed with SIGKILL at random points of every kind of change, and the
API server stopped and restarted during rollouts, on a control plane of the test's own.

Two deployments share a namespace: `soak` (BlueGreen, guard off) is created, updated
compatibly and switched between transfer formats; `guarded` (Recreate, the canary probing the
engine double) has baked a sound revision and is rolled back after an OOM of each new one.
Each kind of change is first timed once without interruption; then the operator is killed
at a point drawn uniformly from that duration (a seeded draw: `DSV4_SOAK_SEED`), restarted,
and the deployment must converge: the served revision is the expected one, its children
exactly the settled set (no orphan, no duplicate, every pod Ready), and the operator writes
nothing in the passes after that. Throughout, a pod watcher checks after every event that no router
targets pods of two transfer formats. In CI the operator is killed 8 times (2 points of each
kind of change; `DSV4_SOAK_KILLS` sets another number); the nightly run (`make nightly`) kills
it 50 times.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, report_container_terminated, wait_for
from dsv4_devcluster.deployments import Cluster, example, rtx_pool, weights_volume
from dsv4_devcluster.operator import OperatorProcess
from dsv4_devcluster.process import free_port
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.context import build_context
from tests.support.paths import CRD_PATH

from .guard_support import EngineKubelet
from .soak_support import FormatWatcher, settled_children

pytestmark = pytest.mark.integration

KILLS = int(os.environ.get("DSV4_SOAK_KILLS", "8"))
NIGHTLY_KILLS = 50
SEED = int(os.environ.get("DSV4_SOAK_SEED", "20261201"))
APISERVER_RESTARTS = 2
APISERVER_DOWN_SECONDS = 5
CONVERGE_SECONDS = 240
RESYNC_SECONDS = 1
KINDS = ("create", "compatible", "format", "rollback")
CHILD_RESOURCES = (
    "statefulsets",
    "deployments",
    "services",
    "poddisruptionbudgets",
    "controllerrevisions",
    "servicemonitors",
)


@pytest.fixture(scope="module")
def soak_plane() -> Iterator[ControlPlane]:
    """A control plane of the soak's own: its API server is stopped and restarted."""
    plane = ControlPlane(with_scheduler=True, with_kwok=True, crds=[CRD_PATH])
    try:
        plane.start()
    except Exception as exc:  # fail, never skip
        pytest.fail(f"could not start the soak control plane: {exc}", pytrace=False)
    try:
        rtx_pool(plane, "soak-rtx", 5)
        yield plane
    finally:
        plane.stop()


def _revision(doc: dict[str, Any]) -> str:
    """The revision hash the operator serves for `doc` (its own pure code)."""
    spec = DSV4DeploymentSpec.model_validate(doc["spec"])
    return build_context(doc["metadata"]["name"], doc["metadata"]["namespace"], spec).revision


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


@dataclass
class Step:
    """One change: `start()` makes it; `settled()` says what is still missing (empty: done)."""

    kind: str
    start: Callable[[], None]
    settled: Callable[[], list[str]]


class Soak:
    """The two deployments, the operator (restarted after each kill) and the engine double."""

    def __init__(self, plane: ControlPlane, cluster: Cluster, log_dir: Path) -> None:
        self.plane, self.cluster, self.log_dir = plane, cluster, log_dir
        self.ns = cluster.namespace
        self.engine_port = free_port()
        self.operator = self._operator()
        self.soak_doc = self._soak_doc(index_k="fp8", requests=64)
        self.guarded_doc = self._guarded_doc()
        self.good = ""
        self.revived: list[str] = []  # control-plane components restarted after exiting
        self.requests = iter(range(60, 0, -1))  # a fresh config hash for every bad revision

    def _operator(self) -> OperatorProcess:
        return OperatorProcess(
            self.plane.kubeconfig_path,
            self.ns,
            self.log_dir,
            DSV4_CANARY_ENDPOINT_ALLOW=f"http://127.0.0.1:{self.engine_port}",
            DSV4_MIN_CANARY_INTERVAL="1s",
            # A pass a second per deployment (the launcher's default: one in two): the quiet
            # checks after each change count passes, not seconds, so they end twice as soon.
            DSV4_RESYNC_SECONDS=str(RESYNC_SECONDS),
        ).start()

    def restart_operator(self) -> None:
        self.operator.kill()
        self.operator = self._operator()

    def _soak_doc(self, index_k: str, requests: int) -> dict[str, Any]:
        return example(
            self.ns,
            name="soak",
            guard={"enabled": False},
            **{
                "rollout.strategy": "BlueGreen",
                "engine.indexKDtype": index_k,
                "engine.maxRunningRequests": requests,
            },
        )

    def _guarded_doc(self, **changes: Any) -> dict[str, Any]:
        guard = {
            "enabled": True,
            "canary": {
                "sessions": 8,
                "rounds": 4,
                "interval": "2s",
                "endpoint": f"http://127.0.0.1:{self.engine_port}",
            },
            "leakRate": {"threshold": 0.02, "minSamples": 30, "confidence": 0.99},
            "bakeTime": "4s",
        }
        return example(
            self.ns, name="guarded", guard=guard, **{"rollout.strategy": "Recreate", **changes}
        )

    # --- what settled means ------------------------------------------------------------------

    def soak_settled(self) -> list[str]:
        revision = _revision(self.soak_doc)
        status = self.cluster.get("soak").get("status", {})
        problems = settled_children(self.cluster, "soak", revision)
        if (status.get("phase"), status.get("currentRevision")) != ("Ready", revision):
            problems.append(f"soak is {status.get('phase')} on {status.get('currentRevision')}")
        return problems

    def guarded_rolled_back(self, bad: str) -> list[str]:
        obj = self.cluster.get("guarded")
        status = obj.get("status", {})
        problems = settled_children(self.cluster, "guarded", self.good)
        if status.get("currentRevision") != self.good:
            problems.append(f"guarded serves {status.get('currentRevision')}, not {self.good}")
        if _condition(obj, "RolledBack").get("status") != "True":
            problems.append("guarded not RolledBack")
        if bad not in [q["hash"] for q in status.get("quarantine", [])]:
            problems.append(f"{bad} not quarantined")
        return problems

    # --- the changes ---------------------------------------------------------------------

    def setup(self) -> None:
        self.cluster.apply(self.soak_doc)
        self.cluster.apply(self.guarded_doc)

        self.good = self.cluster.wait_baked("guarded", timeout=CONVERGE_SECONDS)
        wait_for("soak settled", lambda: not self.soak_settled(), timeout=CONVERGE_SECONDS)

    def step(self, kind: str) -> Step:
        if kind == "create":
            return Step(kind, self._recreate_soak, self.soak_settled)
        if kind == "compatible":
            requests = 48 if self.soak_doc["spec"]["engine"]["maxRunningRequests"] == 64 else 64
            index_k = self.soak_doc["spec"]["engine"]["indexKDtype"]
            return self._soak_change(kind, index_k, requests)
        if kind == "format":
            index_k = "bf16" if self.soak_doc["spec"]["engine"]["indexKDtype"] == "fp8" else "fp8"
            requests = self.soak_doc["spec"]["engine"]["maxRunningRequests"]
            return self._soak_change(kind, index_k, requests)
        return self._rollback()

    def _soak_change(self, kind: str, index_k: str, requests: int) -> Step:
        self.soak_doc = self._soak_doc(index_k=index_k, requests=requests)
        return Step(kind, lambda: self.cluster.apply(self.soak_doc), self.soak_settled)

    def _recreate_soak(self) -> None:
        self.cluster.dsv4.delete(name="soak", namespace=self.ns)
        wait_for(
            "soak and its children gone",
            lambda: (
                not self.cluster.children("soak")
                and not self.cluster.pods("dsv4.io/deployment=soak")
                and not any(
                    d["metadata"]["name"] == "soak"
                    for d in self.cluster.items("dsv4.io/v1alpha1", "DSV4Deployment")
                )
            ),
            timeout=CONVERGE_SECONDS,
        )
        self.cluster.apply(self.soak_doc)

    def _rollback(self) -> Step:
        """A new revision is served, then its decode pod is OOM-killed: the change timed (and
        interrupted) is the rollback that follows."""
        doc = self._guarded_doc(
            **{"engine.indexKDtype": "bf16", "engine.maxRunningRequests": next(self.requests)}
        )
        bad = _revision(doc)
        self.cluster.apply(doc)

        def served() -> bool:
            status = self.cluster.get("guarded").get("status", {})
            return (status.get("phase"), status.get("currentRevision")) == ("Ready", bad) and not (
                settled_children(self.cluster, "guarded", bad)
            )

        wait_for(f"guarded to serve {bad}", served, timeout=CONVERGE_SECONDS)

        def oom() -> None:
            report_container_terminated(
                self.cluster.dyn,
                self.ns,
                "guarded-decode-0",
                "engine",
                reason="OOMKilled",
                exit_code=137,
                message="torch.OutOfMemoryError: CUDA out of memory.",
            )

        return Step("rollback", oom, lambda: self.guarded_rolled_back(bad))

    # --- checks after each change ------------------------------------------------------------

    def converge(self, step: Step, what: str) -> float:
        started = time.monotonic()
        last: list[str] = []

        def done() -> bool:
            nonlocal last
            self.operator.alive_or_raise()
            # The plane's kubelet role: a control-plane component that exited is restarted.
            self.revived += self.plane.restart_exited()
            last = step.settled()
            return not last

        try:
            wait_for(what, done, timeout=CONVERGE_SECONDS)
        except TimeoutError as exc:
            raise AssertionError(f"{what} did not converge: {last}") from exc
        return time.monotonic() - started

    def _writes(self) -> tuple[float, str]:
        """The operator's writes to children (its own counter: controllers also write the
        children's status, an API server restart makes them rewrite it) and the resource
        version of `soak` (only the operator writes its status; `guarded`'s changes with
        every canary run)."""
        children = sum(
            self.operator.metric("dsv4_api_writes_total", resource=resource) or 0
            for resource in CHILD_RESOURCES
        )
        return children, self.cluster.get("soak")["metadata"]["resourceVersion"]

    def assert_quiet(self) -> None:
        """Once the settling pass's status write and Events have landed, nothing written by
        the operator in four more passes."""
        self.operator.settled(self._writes)
        before = self._writes()
        self.operator.more_passes(4)
        after = self._writes()
        assert after == before, f"the operator wrote while nothing changed: {before} -> {after}"


@pytest.mark.long(seconds=260)
def test_kills_and_api_server_restarts_converge_without_mixing_formats(
    soak_plane: ControlPlane, tmp_path: Path
) -> None:
    _soak(soak_plane, tmp_path, KILLS)


@pytest.mark.nightly
def test_kills_and_api_server_restarts_converge_without_mixing_formats_nightly(
    soak_plane: ControlPlane, tmp_path: Path
) -> None:
    _soak(soak_plane, tmp_path, NIGHTLY_KILLS)


def _soak(soak_plane: ControlPlane, tmp_path: Path, kill_count: int) -> None:
    dyn = soak_plane.dynamic_client()
    api = soak_plane.api_client()
    from kubernetes import client

    namespace = "soak"
    dyn.resources.get(api_version="v1", kind="Namespace").create(
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    wait_for(
        "the default ServiceAccount",
        lambda: any(
            s["metadata"]["name"] == "default"
            for s in dyn.resources.get(api_version="v1", kind="ServiceAccount")
            .get(namespace=namespace)
            .to_dict()["items"]
        ),
        timeout=60,
    )
    weights_volume(dyn, namespace)
    cluster = Cluster(dyn, namespace)
    watcher = FormatWatcher(client.CoreV1Api(api), namespace).start()
    soak = Soak(soak_plane, cluster, tmp_path)
    engine = EngineKubelet(cluster, soak.engine_port, tmp_path, name="guarded").start()
    rng = random.Random(SEED)
    durations: dict[str, float] = {}
    kills: Counter[str] = Counter()
    converge_seconds: list[float] = []
    try:
        soak.setup()
        for kind in KINDS:  # uninterrupted, to know how long each kind of change takes
            step = soak.step(kind)
            step.start()
            durations[kind] = soak.converge(step, f"uninterrupted {kind}")
            soak.assert_quiet()
        print(f"soak: seed {SEED}; uninterrupted durations {durations}")
        for i in range(kill_count):
            kind = KINDS[i % len(KINDS)]
            step = soak.step(kind)
            delay = rng.uniform(0, durations[kind])
            step.start()
            time.sleep(delay)
            killed = time.monotonic()
            soak.restart_operator()
            kills[kind] += 1
            soak.converge(step, f"kill {i} ({kind} at +{delay:.2f}s)")
            converge_seconds.append(time.monotonic() - killed)
            print(
                f"soak: kill {i}: {kind} at +{delay:.2f}s of {durations[kind]:.2f}s, converged "
                f"{converge_seconds[-1]:.2f}s after the kill (restart included)"
            )
            soak.assert_quiet()
        for i in range(APISERVER_RESTARTS):
            kind = ("format", "compatible")[i]
            step = soak.step(kind)
            delay = rng.uniform(0, durations[kind])
            step.start()
            time.sleep(delay)
            soak_plane.stop_apiserver()
            time.sleep(APISERVER_DOWN_SECONDS)
            soak_plane.start_apiserver()
            soak.converge(step, f"API server restart {i} ({kind} at +{delay:.2f}s)")
            soak.assert_quiet()
    finally:
        engine.stop()
        soak.operator.stop()
        watcher.stop()
        print(f"--- operator log ({soak.operator.log_path}) ---\n{soak.operator.log_tail(60)}")
        api.close()
        dyn.client.close()
    print(
        f"soak: {sum(kills.values())} kills {dict(kills)}, {APISERVER_RESTARTS} API server "
        f"restarts; converged at most {max(converge_seconds, default=0):.1f}s after a kill "
        f"(restart included); "
        f"watcher saw {watcher.events} pod events over {watcher.relists} lists, "
        f"{len(watcher.violations)} mixed-format states; control-plane components restarted "
        f"after exiting: {soak.revived or 'none'}"
    )
    assert watcher.events > 0
    assert watcher.relists >= 1 + APISERVER_RESTARTS
    assert not watcher.violations, watcher.violations[:10]

"""The controller runtime's wiring: `build_operator` makes one fully wired Operator from the
settings without I/O, kube/ (the REST client) reaches metrics only through callbacks, and
kopf's private modules are imported in one file. The guards get each deployment's spec
parsed once per generation, not once per watch event."""

from __future__ import annotations

import ast
import asyncio
import copy
from pathlib import Path
from typing import Any, cast

import kopf
import pytest
from kubernetes.config import kube_config

from dsv4_operator import metrics
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.guard.observations import Observations
from dsv4_operator.kube.resources import DSV4, DSV4_MODEL, POD, STATEFULSET
from dsv4_operator.names import CREATED_FOR_LABEL, MODEL_KEY_PREFIX
from dsv4_operator.reconcile.group_capture import GroupRestartCapture
from dsv4_operator.reconcile.service import Reconciler
from dsv4_operator.runtime.cache import Listener, WatchCache
from dsv4_operator.runtime.leadership import Leadership
from dsv4_operator.runtime.lease import Timing
from dsv4_operator.runtime.metered import (
    CountedReconciler,
    count_list,
    count_request,
    count_watch_error,
)
from dsv4_operator.runtime.queue import WorkQueue
from dsv4_operator.runtime.specs import OwnerSpecs
from dsv4_operator.runtime.watched import WATCHED, enqueue_owner
from dsv4_operator.runtime.wiring import build_operator
from dsv4_operator.settings import OperatorSettings
from dsv4_operator.signals.supervisor import GuardSupervisor
from tests.support.builders import NOW, example_doc, with_changes
from tests.support.group_pods import group_pod
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
        # A pass that finds no object drops its key from the queue's resync (and a model's).
        for gone in (("a", "deleted"), ("a", MODEL_KEY_PREFIX + "deleted")):
            queue.add(gone)
            assert gone in queue._known
            assert await reconciler(gone) is None
            assert gone not in queue._known
        # A pass's trailing write (a revision to store) that failed runs the key again soon.
        reconciler.trailing.on_failure(("a", "d2"), RuntimeError("refused"))
        assert ("a", "d2") in queue._timers
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


def _owner(spec: dict[str, Any], generation: int | None = 1, uid: str = "u1") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": "x", "uid": uid}
    if generation is not None:
        meta["generation"] = generation
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def test_the_spec_is_parsed_once_per_generation() -> None:
    specs, doc = OwnerSpecs(), example_doc()["spec"]
    first = specs.spec(_owner(doc))
    assert isinstance(first, DSV4DeploymentSpec)
    # A status write (or any change without a new generation) is not parsed again.
    restated = _owner(doc)
    restated["status"] = {"phase": "Ready"}
    assert specs.spec(restated) is first
    # A new generation is, and so is a new object of the same name at the same generation.
    changed = with_changes(doc, {"guard.canary.interval": "90s"})
    second = specs.spec(_owner(changed, generation=2))
    assert second is not None and second is not first
    assert second.guard.canary.interval == "90s"
    recreated = specs.spec(_owner(doc, generation=2, uid="u2"))
    assert recreated is not None and recreated.guard.canary.interval != "90s"
    # An object without a generation is parsed each time; a forgotten one too.
    assert specs.spec(_owner(doc, generation=None)) is not specs.spec(_owner(doc, generation=None))
    kept = specs.spec(_owner(doc, generation=3))
    specs.forget(("ns", "x"))
    assert specs.spec(_owner(doc, generation=3)) is not kept


def test_a_spec_that_does_not_parse_is_none_until_its_next_generation() -> None:
    specs, doc = OwnerSpecs(), example_doc()["spec"]
    broken = with_changes(doc, {"guard.canary.interval": "soon"})
    assert specs.spec(_owner(broken)) is None
    assert specs.spec(_owner(broken)) is None
    assert specs.spec(_owner(doc, generation=2)) is not None


class _Guards:
    """Records what the listener asks of the guard supervisor."""

    def __init__(self) -> None:
        self.ensured: list[tuple[tuple[str, str], DSV4DeploymentSpec | None]] = []
        self.stopped: list[tuple[str, str]] = []
        self.statuses: list[tuple[tuple[str, str], object]] = []
        self.owners: list[tuple[tuple[str, str], object]] = []  # (key, generation)

    def ensure(self, key: tuple[str, str], spec: DSV4DeploymentSpec | None) -> None:
        self.ensured.append((key, spec))

    def stop(self, key: tuple[str, str]) -> None:
        self.stopped.append(key)

    def saw_status(self, key: tuple[str, str], status: object) -> None:
        self.statuses.append((key, status))

    def saw_owner(self, key: tuple[str, str], owner: dict[str, Any]) -> None:
        self.owners.append((key, owner["metadata"].get("generation")))

    def deleted(self, key: tuple[str, str]) -> None:
        self.stopped.append(key)


class _Queue:
    def __init__(self) -> None:
        self.added: list[tuple[tuple[str, str], int | None]] = []

    def add(self, key: tuple[str, str], generation: int | None = None) -> None:
        self.added.append((key, generation))

    def forget(self, key: tuple[str, str]) -> None:
        pass


class _Reconciler:
    def __init__(self) -> None:
        self.group_capture = GroupRestartCapture(lambda: NOW)

    def forget(self, key: tuple[str, str]) -> None:
        pass


class _Leadership:
    def __init__(self, leading: bool) -> None:
        self.leading = asyncio.Event()
        if leading:
            self.leading.set()


def _enqueue_owner(
    queue: _Queue,
    guards: _Guards,
    reconciler: _Reconciler,
    leadership: _Leadership,
    specs: OwnerSpecs,
) -> Listener:
    """`enqueue_owner` with this module's stand-ins for the operator's parts."""
    return enqueue_owner(
        cast(WorkQueue, queue),
        cast(GuardSupervisor, guards),
        cast(Reconciler, reconciler),
        cast(Leadership, leadership),
        specs,
    )


def test_the_listener_hands_the_guards_the_spec_parsed_once_per_generation() -> None:
    guards, queue, specs = _Guards(), _Queue(), OwnerSpecs()
    listener = _enqueue_owner(queue, guards, _Reconciler(), _Leadership(True), specs)
    doc = example_doc()["spec"]
    owner = _owner(doc)
    listener(DSV4, owner, False)
    listener(DSV4, {**copy.deepcopy(owner), "status": {"phase": "Ready"}}, False)
    [(key, first), (_, again)] = guards.ensured
    assert key == ("ns", "x") and isinstance(first, DSV4DeploymentSpec) and again is first
    # Every status seen goes to the guards: a change of the served revision cuts the tap reads.
    assert guards.statuses[-1] == (("ns", "x"), {"phase": "Ready"})
    # ... and every change of the owner to its culprit search, with the generation it is at.
    assert guards.owners == [(("ns", "x"), owner["metadata"]["generation"])] * 2
    listener(DSV4, _owner(with_changes(doc, {"guard.canary.interval": "soon"}), 2), False)
    assert guards.ensured[-1] == (("ns", "x"), None)  # invalid: the guard stops
    # A child's change enqueues its owner and leaves the guard alone.
    child = {
        "metadata": {"namespace": "ns", "name": "x-decode", "labels": {"dsv4.io/deployment": "x"}}
    }
    listener(STATEFULSET, child, False)
    assert len(guards.ensured) == 3 and queue.added[-1] == (("ns", "x"), None)
    listener(DSV4, owner, True)
    assert guards.stopped == [("ns", "x")]


def test_the_listener_hands_every_pod_event_to_the_group_restart_capture() -> None:
    queue, reconciler = _Queue(), _Reconciler()
    listener = _enqueue_owner(queue, _Guards(), reconciler, _Leadership(True), OwnerSpecs())
    listener(POD, group_pod(0, "r1"), False)
    listener(POD, group_pod(1, "r1", restarts=1, message="CUDA out of memory"), False)
    listener(POD, group_pod(1, "r1", restarts=1, message="CUDA out of memory"), True)
    [restart] = reconciler.group_capture.pending(("ns", "x"), recorded=[])
    assert restart.group == "x-decode-0" and restart.key == "uid-1/1"
    assert queue.added[-1] == (("ns", "x"), None)


def test_the_operators_own_writes_wake_only_what_depends_on_them_across_objects() -> None:
    """A write the cache hears of from its reply (own) tells the listener once; its watch event
    then tells no one. So an own write must still wake what another object's pass needs."""
    guards, queue = _Guards(), _Queue()
    listener = _enqueue_owner(queue, guards, _Reconciler(), _Leadership(True), OwnerSpecs())
    # The DSV4Model a deployment's pass created: its own pass and its user's run.
    model = {
        "metadata": {
            "namespace": "ns",
            "name": "flash",
            "generation": 1,
            "labels": {CREATED_FOR_LABEL: "x"},
        }
    }
    listener(DSV4_MODEL, model, False, True)
    assert queue.added == [(("ns", MODEL_KEY_PREFIX + "flash"), 1), (("ns", "x"), None)]
    # A deployment's own status write: not queued again (its pass just ran), but its guard
    # sees the status (a rollback's served revision, its culprit search).
    queue.added.clear()
    owner = _owner(example_doc()["spec"])
    listener(DSV4, owner, False, True)
    assert queue.added == [] and guards.ensured == []
    assert guards.statuses == [(("ns", "x"), {"phase": "Pending"})]
    assert guards.owners == [(("ns", "x"), 1)]
    # A child the deployment's pass applied wakes no one.
    child = {
        "metadata": {"namespace": "ns", "name": "x-decode", "labels": {"dsv4.io/deployment": "x"}}
    }
    listener(STATEFULSET, child, False, True)
    assert queue.added == []
    listener(STATEFULSET, child, False)  # the same child changed by someone else
    assert queue.added == [(("ns", "x"), None)]


def test_a_standby_runs_no_guard() -> None:
    guards = _Guards()
    listener = _enqueue_owner(_Queue(), guards, _Reconciler(), _Leadership(False), OwnerSpecs())
    listener(DSV4, _owner(example_doc()["spec"]), False)
    assert guards.ensured == []


class _Cache:
    """A synced watch cache holding two deployments."""

    def __init__(self, owners: list[dict[str, Any]]) -> None:
        self.owners = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in owners}

    async def wait_synced(self) -> None:
        pass

    def keys(self, res: Any) -> list[tuple[str, str]]:
        return sorted(self.owners) if res == DSV4 else []  # no DSV4Model

    async def get(self, res: Any, namespace: str, name: str) -> dict[str, Any] | None:
        return self.owners.get((namespace, name))


class _RunQueue(_Queue):
    async def run(self) -> None:
        pass


async def test_on_becoming_leader_guards_start_for_every_known_deployment() -> None:
    doc = example_doc()["spec"]
    other = _owner(doc)
    other["metadata"]["name"] = "y"
    guards, queue, specs = _Guards(), _RunQueue(), OwnerSpecs()
    leadership = Leadership(
        cast(WatchCache, _Cache([_owner(doc), other])),
        cast(WorkQueue, queue),
        cast(GuardSupervisor, guards),
        None,
        specs,
    )
    try:
        await leadership.run()
    finally:
        metrics.LEADER.set(0)  # the process-wide gauge, as a fresh process has it
    assert [key for key, _ in guards.ensured] == [("ns", "x"), ("ns", "y")]
    assert all(isinstance(spec, DSV4DeploymentSpec) for _, spec in guards.ensured)
    assert queue.added == [(("ns", "x"), 1), (("ns", "y"), 1)]
    # The listener that runs next shares the parses: the same generation is not parsed again.
    assert specs.spec(_owner(doc)) is guards.ensured[0][1]


class _EmptyReader:
    async def get(self, res: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        return None

    async def list(self, res: Any, namespace: str | None, labels: Any = None) -> list[Any]:
        return []

    async def serves(self, res: Any) -> bool:
        return True


async def test_the_guard_supervisor_runs_on_a_parsed_spec_the_policy_allows() -> None:
    guards = GuardSupervisor(_EmptyReader(), Observations(), wake=lambda key: None)
    key, doc = ("ns", "x"), example_doc()["spec"]
    spec = DSV4DeploymentSpec.model_validate(doc)
    try:
        guards.ensure(key, spec)
        loop = guards._tasks[key][1]
        guards.ensure(key, spec)
        assert guards._tasks[key][1] is loop  # same settings: the same loop goes on
        guards.ensure(key, None)  # the spec no longer parses
        assert key not in guards._tasks
        guards.ensure(key, spec)
        elsewhere = with_changes(doc, {"guard.canary.endpoint": "http://elsewhere.example/v1"})
        guards.ensure(key, DSV4DeploymentSpec.model_validate(elsewhere))
        assert key not in guards._tasks  # the trust policy forbids the endpoint
    finally:
        await guards.close()

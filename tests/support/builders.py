"""Builders of the tests' inputs: the example spec and changes to it, the world `decide()`
reads (as gather() builds it), and children as the API server holds them once applied."""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime
from typing import Any

import yaml

from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.engine.validation import validate_spec
from dsv4_operator.reconcile.world import World
from tests.support.paths import EXAMPLE

Doc = dict[str, Any]

# The clock of every hand-built world (a pure decision reads the time from its input).
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def example_doc() -> Doc:
    """examples/dsv4.yaml, freshly read (the caller may change it)."""
    doc: Doc = yaml.safe_load(EXAMPLE.read_text())
    return doc


def set_path(doc: Doc, dotted: str, value: Any) -> None:
    """Set `a.b.c` in a nested dict, creating mappings on the way."""
    *parents, last = dotted.split(".")
    node = doc
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def with_changes(spec: Doc, changes: dict[str, Any]) -> Doc:
    """A copy of `spec` with `{"engine.indexKDtype": "bf16", ...}` applied."""
    changed = copy.deepcopy(spec)
    for dotted, value in changes.items():
        set_path(changed, dotted, value)
    return changed


def make_world(spec: Doc, status: DSV4DeploymentStatus | Doc | None = None, **kw: Any) -> World:
    """A world as gather() builds it: the spec validated, the status parsed, and the children
    (given as the API server returns them: `statefulsets=[...]`, `pods=[...]`, ...) read
    through their views."""
    base: dict[str, Any] = {
        "name": "x",
        "namespace": "ns",
        "uid": "u1",
        "generation": 1,
        "validation": validate_spec(spec),
        "status": DSV4DeploymentStatus.model_validate(status or {}),
        "now": NOW,
    }
    base.update(kw)
    return World.from_objects(**base)


def as_live(objs: list[Doc], ready: bool = True) -> dict[str, Any]:
    """What the API server would hold after applying `objs` (and, if ready, after rolling)."""
    pools: dict[str, list[Doc]] = {
        "statefulsets": [],
        "deployments": [],
        "services": [],
        "pdbs": [],
    }
    key = {
        "StatefulSet": "statefulsets",
        "LeaderWorkerSet": "statefulsets",  # the engine workloads of multi-node roles
        "Deployment": "deployments",
        "Service": "services",
        "PodDisruptionBudget": "pdbs",
    }
    for obj in objs:
        live = copy.deepcopy(obj)
        live["metadata"]["generation"] = 1
        replicas = live.get("spec", {}).get("replicas", 1)
        if obj["kind"] == "LeaderWorkerSet":  # its replicas are groups; no revision fields
            live["status"] = {
                "observedGeneration": 1,
                "replicas": replicas,
                "readyReplicas": replicas if ready else 0,
                "updatedReplicas": replicas,
            }
        if obj["kind"] == "StatefulSet":
            n = replicas if ready else 0
            live["status"] = {
                "observedGeneration": 1,
                "replicas": replicas,
                "readyReplicas": n,
                "updatedReplicas": replicas,
                "currentRevision": "r",
                "updateRevision": "r",
            }
        if obj["kind"] == "Deployment":
            live["status"] = {
                "observedGeneration": 1,
                "replicas": replicas,
                "updatedReplicas": replicas,
                "availableReplicas": replicas if ready else 0,
            }
        pools[key[obj["kind"]]].append(live)
    return pools


def silent_pod(created: str, **metadata: Any) -> Doc:
    """A pod on a node since `created`, not ready, its status naming no cause (its engine
    ContainerCreating): only its Events can say why (a FailedMount)."""
    return {
        "metadata": {"name": "x-decode-0", "creationTimestamp": created, **metadata},
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False"},
            ],
            "containerStatuses": [
                {"name": "engine", "state": {"waiting": {"reason": "ContainerCreating"}}}
            ],
        },
    }


def engine_pod(
    revision: str, terminated: Doc, state: str = "lastState", role: str = "decode"
) -> Doc:
    """An engine pod of `revision` whose container terminated so (in `state` or `lastState`)."""
    return {
        "metadata": {
            "name": f"x-{role}-0",
            "uid": "p1",
            "labels": {"dsv4.io/role": role, "dsv4.io/revision": revision},
        },
        "status": {
            "containerStatuses": [
                {"name": "engine", "restartCount": 1, state: {"terminated": terminated}}
            ]
        },
    }


def stored_model(model: Doc, generation: int = 1, status: Doc | None = None) -> Doc:
    """A DSV4Model manifest (an inline repo's, from decide()'s apply) as the API server
    stores it: a uid, a generation, defaults filled in, and `status` if given."""
    from dsv4_operator.api.models import DSV4ModelSpec

    stored = copy.deepcopy(model)
    stored["metadata"].update(uid="m1", generation=generation, resourceVersion="7")
    stored["spec"] = DSV4ModelSpec.model_validate(stored["spec"]).to_wire()
    if status is not None:
        stored["status"] = status
    return stored


def model_world(model: Doc, **kw: Any) -> Any:
    """The ModelWorld of a stored DSV4Model, as gather_model() builds it: `weights=[...]`
    (claim, Jobs, rights, the Jobs' pods), `users=[...]`, other fields by name."""
    from dsv4_operator.reconcile.model_world import ModelWorld

    facts = {k: kw.pop(k) for k in ("users", "weights") if k in kw}
    world = ModelWorld.from_objects(model, NOW, **facts)
    return dataclasses.replace(world, **kw) if kw else world


class SettledReader:
    """The guard's reader of a deployment that is Ready at revision `abc`, with no pods."""

    async def get(self, res: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        return {"status": {"phase": "Ready", "currentRevision": "abc"}}

    async def list(self, res: Any, namespace: str | None, labels: Any = None) -> list[Any]:
        return []

    async def serves(self, res: Any) -> bool:
        return True

"""The facts one DSV4Model pass decides on, and gather_model() that reads them (the cache).

Its children (claim, download Jobs, the Jobs' rights) are selected by the model label and
kept only when this very model owns them; the deployments that use it are those of its
namespace whose spec names it (api/models.model_name_of).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from dsv4_operator.api.models import (
    DSV4ModelSpec,
    DSV4ModelStatus,
    model_name_of,
    parse_model_status,
)
from dsv4_operator.kube.objects import Obj, name_of
from dsv4_operator.kube.reader import Reader
from dsv4_operator.kube.resources import DSV4, DSV4_MODEL, POD, WEIGHTS_KINDS
from dsv4_operator.names import MODEL_LABEL
from dsv4_operator.pods import PodView
from dsv4_operator.reconcile.pod_causes import PodWarnings


@dataclass(frozen=True)
class ModelWorld:
    """Everything decide_model() reads."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: DSV4ModelSpec | None  # None: the stored spec does not parse (`spec_error` says why)
    status: DSV4ModelStatus
    now: datetime
    spec_error: str = ""
    deleting: bool = False
    finalizers: tuple[str, ...] = ()
    resource_version: str = ""
    # DSV4Deployments of the namespace that reference this model, by name (sorted).
    users: tuple[str, ...] = ()
    weights: list[Obj] = field(default_factory=list)  # claim, Jobs, rights; each with its kind
    weights_pods: list[PodView] = field(default_factory=list)  # the Jobs' pods
    pod_events: dict[str, PodWarnings] = field(default_factory=dict)  # the stuck ones'
    missing_secrets: frozenset[str] = frozenset()

    @classmethod
    def from_objects(
        cls, model: Obj, now: datetime, *, users: Iterable[str] = (), weights: Iterable[Obj] = ()
    ) -> ModelWorld:
        """The world of a stored DSV4Model, its children (Pods among them) and users."""
        meta = model["metadata"]
        spec: DSV4ModelSpec | None = None
        error = ""
        try:
            spec = DSV4ModelSpec.model_validate(model.get("spec") or {})
        except ValidationError as failure:
            error = "; ".join(
                f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in failure.errors()
            )
        children = list(weights)
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace") or "",
            uid=meta.get("uid") or "",
            generation=int(meta.get("generation", 0)),
            spec=spec,
            spec_error=error,
            status=parse_model_status(model.get("status")),
            now=now,
            deleting=bool(meta.get("deletionTimestamp")),
            finalizers=tuple(meta.get("finalizers") or ()),
            resource_version=str(meta.get("resourceVersion") or ""),
            users=tuple(sorted(set(users))),
            weights=[o for o in children if o.get("kind") != "Pod"],
            weights_pods=[PodView.of(o) for o in children if o.get("kind") == "Pod"],
        )

    def live(self, kind: str, name: str) -> Obj | None:
        return next((o for o in self.weights_objects(kind) if name_of(o) == name), None)

    def weights_objects(self, kind: str) -> list[Obj]:
        return [o for o in self.weights if o.get("kind") == kind]


def _owned_by(items: list[Obj], uid: str) -> list[Obj]:
    return [
        o
        for o in items
        if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences", []))
    ]


async def gather_model(
    client: Reader, namespace: str, name: str, now: datetime, **facts: Any
) -> ModelWorld | None:
    """The world of one DSV4Model, or None when it no longer exists."""
    model = await client.get(DSV4_MODEL, namespace, name)
    if model is None:
        return None
    uid = model["metadata"].get("uid") or ""
    selector = {MODEL_LABEL: name}
    children: list[Obj] = []
    for res in WEIGHTS_KINDS:
        kind = {"apiVersion": res.api_version, "kind": res.kind}
        listed = await client.list(res, namespace, selector)
        children += [{**o, **kind} for o in _owned_by(listed, uid)]
    pods = await client.list(POD, namespace, selector)
    children += [{**p, "apiVersion": "v1", "kind": "Pod"} for p in pods]
    users = [
        name_of(d)
        for d in await client.list(DSV4, namespace)
        if model_name_of(d) == name and not d["metadata"].get("deletionTimestamp")
    ]
    return ModelWorld.from_objects(model, now, users=users, weights=children)

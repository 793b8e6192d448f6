"""gather(): read the owner and everything it owns into a World (from the watch cache).

The typed boundary: the owner's spec is validated (parsed, checked, planned) and its status
parsed here, once per pass, and the children a decision reads become views
(`World.from_objects`); nothing after this reads them as dicts.
"""

from __future__ import annotations

from datetime import datetime

from dsv4_operator.api.models import model_name_of
from dsv4_operator.api.status import parse_status
from dsv4_operator.guard.observations import Observations
from dsv4_operator.kube.objects import Obj, labels_of
from dsv4_operator.kube.reader import Reader
from dsv4_operator.kube.resources import (
    CONTROLLER_REVISION,
    DEPLOYMENT,
    DSV4,
    DSV4_MODEL,
    LEADER_WORKER_SET,
    PDB,
    POD,
    SERVICE,
    SERVICE_MONITOR,
    STATEFULSET,
    Resource,
)
from dsv4_operator.names import DEPLOYMENT_LABEL, LWS_KIND, ROLE_LABEL
from dsv4_operator.reconcile.validations import SpecValidations
from dsv4_operator.reconcile.world import World
from dsv4_operator.render.weights import WEIGHTS_COMPONENT
from dsv4_operator.trust import TrustPolicy


def _owned(items: list[Obj], uid: str) -> list[Obj]:
    """Only children whose controller is this very object (not a namesake's leftovers)."""
    return [
        o
        for o in items
        if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences", []))
    ]


async def gather(
    client: Reader,
    namespace: str,
    name: str,
    now: datetime,
    observations: Observations | None = None,
    policy: TrustPolicy | None = None,
    validations: SpecValidations | None = None,
) -> World | None:
    """The world of one DSV4Deployment, or None when it no longer exists. `validations`
    keeps each spec's validation until its generation changes (none: validated afresh)."""
    owner = await client.get(DSV4, namespace, name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return None
    uid = owner["metadata"]["uid"]
    selector = {DEPLOYMENT_LABEL: name}

    async def owned(res: Resource) -> list[Obj]:
        return _owned(await client.list(res, namespace, selector), uid)

    # Listed even when disabled, so a monitor left from before is deleted (404 -> none).
    monitors = await owned(SERVICE_MONITOR)
    # Multi-node roles' LeaderWorkerSets, where LWS is installed; a list item has no kind.
    groups_served = await client.serves(LEADER_WORKER_SET)
    groups = (
        [{**o, "kind": LWS_KIND} for o in await owned(LEADER_WORKER_SET)] if groups_served else []
    )
    pods = await client.list(POD, namespace, selector)
    # The DSV4Model whose weights it uses (docs/models.md): not a child, never owned by it.
    model_name = model_name_of(owner)
    model = await client.get(DSV4_MODEL, namespace, model_name) if model_name else None
    kind = {"apiVersion": DSV4_MODEL.api_version, "kind": DSV4_MODEL.kind}
    weights = [{**model, **kind}] if model else []
    return World.from_objects(
        name=name,
        namespace=namespace,
        uid=uid,
        generation=int(owner["metadata"].get("generation", 0)),
        validation=(validations or SpecValidations()).of(owner, policy),
        status=parse_status(owner.get("status")),
        now=now,
        statefulsets=[{**o, "kind": "StatefulSet"} for o in await owned(STATEFULSET)]
        + [{**o, "kind": LWS_KIND} for o in groups],
        deployments=await owned(DEPLOYMENT),
        services=await owned(SERVICE),
        pdbs=await owned(PDB),
        service_monitors=monitors,
        revisions=await owned(CONTROLLER_REVISION),
        # Pods are owned by StatefulSets (ours, or the LWS controller's), not by us: select by
        # label only. A download Job's pods (an operator before models) are no engine (no OOM,
        # no leftover).
        pods=[p for p in pods if labels_of(p).get(ROLE_LABEL) != WEIGHTS_COMPONENT],
        weights=weights,
        annotations=dict(owner["metadata"].get("annotations") or {}),
        canary=observations.snapshot((namespace, name)) if observations else None,
        monitoring_served=await client.serves(SERVICE_MONITOR),
        groups_served=groups_served,
    )

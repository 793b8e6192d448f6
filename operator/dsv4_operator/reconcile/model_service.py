"""act_model(): carry out a DSV4Model pass's decision (reconcile/service.py runs the pass)."""

from __future__ import annotations

from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import NotFound
from dsv4_operator.kube.resources import DSV4_MODEL
from dsv4_operator.names import MODEL_KIND
from dsv4_operator.reconcile.act import Observe
from dsv4_operator.reconcile.model_decide import ModelDecision
from dsv4_operator.reconcile.model_world import ModelWorld
from dsv4_operator.reconcile.recorder import EventRecorder, Subject


async def act_model(
    client: KubeClient,
    world: ModelWorld,
    decision: ModelDecision,
    recorder: EventRecorder,
    observe: Observe,
) -> None:
    """The finalizers first (a new model is protected before anything is made for it), then
    the children, the status and the Events. A model whose finalizer goes may vanish at once:
    nothing is written to it after that."""
    if decision.finalizers is not None:
        patch = {
            "metadata": {
                "finalizers": decision.finalizers,
                "resourceVersion": world.resource_version,
            }
        }
        try:
            observe(await client.merge_patch(DSV4_MODEL, world.namespace, world.name, patch))
        except NotFound:
            return
        if world.deleting:
            return  # released: the garbage collector takes it and its weights
    for res, name in decision.delete:
        await client.delete(res, world.namespace, name)
    for obj in decision.apply:
        observe(await client.apply(obj))
    status = decision.status.to_wire()
    if status != world.status.to_wire():
        observe(await client.apply_status(DSV4_MODEL, world.namespace, world.name, status))
    subject = Subject(world.namespace, world.name, world.uid, MODEL_KIND)
    for note in decision.events:
        await recorder.post(subject, note, world.now)

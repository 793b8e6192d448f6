"""What one reconcile pass decided (Decision), and the accumulator decide() fills (Actions)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.events import EventType, Note
from dsv4_operator.guard.oom import OomEvent
from dsv4_operator.guard.plan import PlanCheck
from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import Resource
from dsv4_operator.names import DEFAULT_OPERATOR_IMAGE
from dsv4_operator.reasons import RollbackReason
from dsv4_operator.reconcile.diff import to_apply
from dsv4_operator.reconcile.world import World
from dsv4_operator.trust import TrustPolicy


@dataclass
class Decision:
    """What act() does: apply, delete, revisions, status, events; and when to look again."""

    apply: list[Obj] = field(default_factory=list)
    delete: list[tuple[Resource, str]] = field(default_factory=list)
    create: list[Obj] = field(default_factory=list)
    status: DSV4DeploymentStatus = field(default_factory=DSV4DeploymentStatus)
    events: list[Note] = field(default_factory=list)
    # A wait on the world (pods, replicas) needs no timer: a watch event on the awaited
    # object brings the key back. Only the clock (a bake time) sets `requeue_after`.
    waiting: bool = False
    requeue_after: float | None = None
    ooms: list[OomEvent] = field(default_factory=list)
    rollbacks: list[RollbackReason] = field(default_factory=list)
    cleared: bool = False  # a quarantine entry was released: the guard's window restarts
    plan: PlanCheck | None = None  # PlanVerified of the revision rolled out to, when checked

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.delete) + len(self.create)


@dataclass(frozen=True)
class ReconcileSettings:
    """The knobs decide() takes from the operator settings (settings.OperatorSettings)."""

    revision_history_limit: int = 10
    trust: TrustPolicy = field(default_factory=TrustPolicy)
    operator_image: str = DEFAULT_OPERATOR_IMAGE


class Actions:
    """Accumulates the actions of one pass, skipping objects already in place."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.decision = Decision()

    def ensure(self, objs: list[Obj]) -> bool:
        """Queue objects that differ from the world; True when all were already in place."""
        done = True
        for obj in objs:
            desired = to_apply(obj, self.world.live(obj["kind"], obj["metadata"]["name"]))
            if desired is not None:
                self.decision.apply.append(desired)
                done = False
        return done

    def remove(self, res: Resource, name: str) -> None:
        if self.world.live(res.kind, name) is not None:
            self.decision.delete.append((res, name))

    def note(
        self, type_: EventType, reason: str, message: str, revision: str | None = None
    ) -> None:
        self.decision.events.append(Note(type_, reason, message, revision))

    def wait(self) -> None:
        self.decision.waiting = True

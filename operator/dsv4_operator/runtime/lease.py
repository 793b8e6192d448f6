"""Leader election on a coordination.k8s.io Lease: one replica reconciles, the others wait.

The rules are client-go's (k8s.io/client-go/tools/leaderelection), so a Lease is read the same
way by both: a holder keeps the Lease by writing `renewTime` every `retry` seconds; another
replica may take it over once it has seen the same record unchanged for `duration` seconds on
its *own* clock (never by comparing its clock with the holder's `renewTime`, so clock skew
between nodes cannot hand the Lease to two replicas), or at once when `holderIdentity` is empty
(the holder released it on a clean shutdown). Every write is a PUT or POST that carries the
resourceVersion it read, so two candidates racing for the same expired Lease cannot both win:
the API server refuses the second with 409 Conflict.

With an `owner` (the operator's Deployment), every write names it in the Lease's
ownerReferences, so the garbage collector deletes the Lease with the Deployment (`helm
uninstall`); a Lease written before it had one gets it at the next write.

A holder that cannot renew for `deadline` seconds stops leading (`hold()` returns); the
operator then exits, as controller-runtime does, because it cannot know what the new leader
has done since.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import Conflict, Forbidden, KubeError
from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import DEPLOYMENT, LEASE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """client-go's defaults: a new leader within `duration` + `retry` of a crash."""

    duration: float = 15.0  # how long a seen record must stay unchanged before a takeover
    deadline: float = 10.0  # a holder that has not renewed for this long stops leading
    retry: float = 2.0  # how often candidates try and the holder renews

    @classmethod
    def for_duration(cls, duration: float) -> Timing:
        """The holder renews every duration/7.5 and gives up after 2/3 of it (client-go's
        ratios: 15 s, 10 s, 2 s)."""
        return cls(duration=duration, deadline=duration * 2 / 3, retry=duration / 7.5)


def micro_time(at: datetime) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: Obj) -> tuple[str, str, int]:
    """What must change for a holder to count as alive."""
    spec = lease.get("spec") or {}
    return (
        str(spec.get("holderIdentity") or ""),
        str(spec.get("renewTime") or ""),
        int(spec.get("leaseTransitions") or 0),
    )


@dataclass
class Observed:
    """The last record seen, and when (on this replica's monotonic clock)."""

    record: tuple[str, str, int]
    at: float


def may_take(lease: Obj, observed: Observed | None, me: str, now: float, duration: float) -> bool:
    """Whether `me` may write itself into `lease` now (pure: `now` is a monotonic reading)."""
    holder = _record(lease)[0]
    if holder in ("", me):
        return True
    if observed is None or observed.record != _record(lease):
        return False  # first sight of this record: its expiry is counted from now
    return now - observed.at >= duration


def lease_owner_reference(deployment: Obj) -> Obj:
    """An ownerReference to `deployment` (not a controller's, nor blocking its deletion, which
    would take a finalizers permission the operator does not need)."""
    meta = deployment["metadata"]
    return {
        "apiVersion": DEPLOYMENT.api_version,
        "kind": DEPLOYMENT.kind,
        "name": meta["name"],
        "uid": meta["uid"],
    }


def with_owners(metadata: Obj, owners: list[Obj]) -> Obj:
    """`metadata` with each of `owners` among its ownerReferences (by uid; others kept)."""
    present = list(metadata.get("ownerReferences") or [])
    uids = {r.get("uid") for r in present}
    missing = [o for o in owners if o["uid"] not in uids]
    return {**metadata, "ownerReferences": present + missing} if missing else metadata


class LeaderElector:
    """Campaigns for one Lease and keeps it; see the module docstring."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        owner: str = "",
    ) -> None:
        self.client, self.namespace, self.name, self.identity = client, namespace, name, identity
        self.timing = timing or Timing()
        self.monotonic, self.wall = monotonic, wall
        self.observed: Observed | None = None
        self.owner = owner
        self._owner_references: list[Obj] | None = None  # read once, on the first write

    async def owner_references(self) -> list[Obj]:
        """The ownerReferences the Lease carries: the owner Deployment's, once it has been read
        (none without an owner, or while the Deployment cannot be found)."""
        if not self.owner:
            return []
        if self._owner_references is None:
            try:
                deployment = await self.client.get(DEPLOYMENT, self.namespace, self.owner)
            except Forbidden as error:  # RBAC without it: lead all the same, with no owner
                log.warning("lease owner %s/%s not readable: %s", self.namespace, self.owner, error)
                self._owner_references = []
                return []
            except KubeError as error:  # tried again at the next write
                log.warning("lease owner %s/%s not read: %s", self.namespace, self.owner, error)
                return []
            if deployment is None:
                log.warning("lease owner %s/%s not found", self.namespace, self.owner)
                return []
            self._owner_references = [lease_owner_reference(deployment)]
        return self._owner_references

    async def acquire(self) -> None:
        """Until this replica holds the Lease (API errors are retried, never fatal)."""
        while True:
            try:
                if await self._try():
                    break
            except KubeError as error:  # unreachable, forbidden: say so and keep trying
                log.warning("lease %s/%s not acquired: %s", self.namespace, self.name, error)
            await asyncio.sleep(self.timing.retry)
        log.info("leading: lease %s/%s held by %s", self.namespace, self.name, self.identity)

    async def hold(self) -> None:
        """Renew every `retry` seconds; return when the Lease could not be kept."""
        last_renewal = self.monotonic()
        while True:
            await asyncio.sleep(self.timing.retry)
            try:
                if await self._try():
                    last_renewal = self.monotonic()
                    continue
                log.error("lease %s/%s was taken over", self.namespace, self.name)
                return
            except KubeError as error:
                log.warning("lease renewal failed: %s", error)
            if self.monotonic() - last_renewal >= self.timing.deadline:
                log.error(
                    "lease %s/%s not renewed for %.0fs",
                    self.namespace,
                    self.name,
                    self.timing.deadline,
                )
                return

    async def release(self) -> None:
        """On a clean shutdown: empty the holder so a standby takes over at once."""
        for _ in range(2):  # a renewal cut short may have changed the version: read it again
            try:
                current = await self.client.get(LEASE, self.namespace, self.name)
                if current is None or _record(current)[0] != self.identity:
                    return
                released = {**current, "spec": {**current["spec"], "holderIdentity": ""}}
                await self.client.replace(released)
                return
            except Conflict:
                continue
            except KubeError as error:  # the standby then waits out the duration instead
                log.warning("could not release lease %s/%s: %s", self.namespace, self.name, error)
                return

    async def _try(self) -> bool:
        """One attempt to take or renew the Lease; True while this replica holds it."""
        now, wall = self.monotonic(), micro_time(self.wall())
        current = await self.client.get(LEASE, self.namespace, self.name)
        owners = await self.owner_references()
        if current is None:
            metadata: Obj = {"name": self.name, "namespace": self.namespace}
            if owners:
                metadata["ownerReferences"] = owners
            body = {
                "apiVersion": LEASE.api_version,
                "kind": LEASE.kind,
                "metadata": metadata,
                "spec": self._spec(wall, acquire_time=wall, transitions=0),
            }
            try:
                await self.client.create(body)
            except Conflict:  # another replica created it first
                return False
            return True
        if self.observed is None or self.observed.record != _record(current):
            self.observed = Observed(_record(current), now)
        if not may_take(current, self.observed, self.identity, now, self.timing.duration):
            return False
        holder, _, transitions = _record(current)
        spec = current.get("spec") or {}
        mine = holder == self.identity
        updated = {
            **current,
            "metadata": with_owners(current.get("metadata") or {}, owners),
            "spec": self._spec(
                wall,
                acquire_time=spec.get("acquireTime") if mine else wall,
                transitions=transitions if mine else transitions + 1,
            ),
        }
        try:
            written = await self.client.replace(updated)
        except Conflict:  # someone wrote it since we read it: they won this round
            return False
        self.observed = Observed(_record(written), now)
        return True

    def _spec(self, renew: str, acquire_time: str | None, transitions: int) -> Obj:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.timing.duration),
            "acquireTime": acquire_time,
            "renewTime": renew,
            "leaseTransitions": transitions,
        }

"""One reconcile pass for one key: gather -> decide -> act, with an injectable clock."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from dsv4_operator.events import Note
from dsv4_operator.guard.observations import Observations
from dsv4_operator.guard.plan import PlanCheck
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import Forbidden, KubeError, refused
from dsv4_operator.kube.reader import CachedReader, Reader
from dsv4_operator.kube.resources import DSV4, SECRET
from dsv4_operator.metrics import GuardMetrics
from dsv4_operator.names import MODEL_KEY_PREFIX, MODEL_KIND
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import ConditionReason, EventReason
from dsv4_operator.reconcile.act import act, ignore
from dsv4_operator.reconcile.actions import Decision, ReconcileSettings
from dsv4_operator.reconcile.decide import decide
from dsv4_operator.reconcile.gather import gather
from dsv4_operator.reconcile.group_capture import GroupRestartCapture
from dsv4_operator.reconcile.guarding import served_spec
from dsv4_operator.reconcile.model_decide import decide_model
from dsv4_operator.reconcile.model_service import act_model
from dsv4_operator.reconcile.model_world import gather_model
from dsv4_operator.reconcile.pod_causes import EVENTS_REFRESH_SECONDS, PodWarnings, unexplained
from dsv4_operator.reconcile.recorder import EventRecorder, Subject
from dsv4_operator.reconcile.refusals import Refusals
from dsv4_operator.reconcile.status import with_rejection
from dsv4_operator.reconcile.trailing import Trailing
from dsv4_operator.reconcile.validations import SpecValidations
from dsv4_operator.reconcile.world import World

log = logging.getLogger(__name__)
Clock = Callable[[], datetime]
# Stuck pods' Events kept between listings (pod_causes.EVENTS_REFRESH_SECONDS): at most this
# many pods', the oldest dropped first.
EVENTS_CACHE_SIZE = 1024
# After a trailing write failed: soon, but not at once (the API server may be what failed).
TRAILING_RETRY_SECONDS = 10.0
# The optional reads RBAC may refuse (Refusals' keys, and what the log says could not be done).
LIST_EVENTS = "list Events"
GET_SECRETS = "get Secrets"


def _plan_series(plan: PlanCheck | None) -> tuple[str, bool | None] | None:
    """dsv4_plan_verified's revision and value (None: not all engines answered yet)."""
    if plan is None:
        return None
    return plan.revision, (plan.verified if plan.verified or plan.mismatch else None)


def utc_now() -> datetime:
    return datetime.now(UTC)


class Reconciler:
    """Binds the client, settings and clock; called by the work queue with a key.

    Reads go to `cache` (the operator's watch cache; the client itself when none is given),
    writes to `client`; what a write returns is folded into the cache.
    """

    def __init__(
        self,
        client: KubeClient,
        settings: ReconcileSettings,
        clock: Clock = utc_now,
        observations: Observations | None = None,
        cache: CachedReader | None = None,
    ) -> None:
        self.client = client
        self.cache = cache
        self.reader: Reader = cache or client
        self.recorder = EventRecorder(client)
        self.settings = settings
        self.clock = clock
        self.observations = observations or Observations()
        # Fed by the watch cache's Pod events (runtime/watched.py), read by every pass.
        self.group_capture = GroupRestartCapture(clock)
        self.validations = SpecValidations()
        self.guard_metrics = GuardMetrics()
        # Events and Secrets the operator's RBAC may not grant (a hardened cluster, an older
        # chart): refused reads are asked again after RETRY_SECONDS, per namespace.
        self.refusals = Refusals(clock)
        self._pod_events: dict[tuple[str, str], PodWarnings] = {}
        # Told of a key whose object no longer exists (the work queue's `gone`).
        self.gone: Callable[[tuple[str, str]], None] = lambda key: None
        # Asked to run a key's pass again after a delay (the work queue's `add_after`).
        self.retry: Callable[[tuple[str, str], float], None] = lambda key, delay: None
        # The ControllerRevisions and Events of each key's last pass, written after it.
        self.trailing = Trailing(self._trailing_failed)

    def _trailing_failed(self, key: tuple[str, str], error: Exception) -> None:
        """The last pass of `key` left writes that failed (a ControllerRevision; an Event the
        API server refuses is logged and dropped by the recorder): the next pass, soon, finds
        the revision missing and stores it."""
        log.warning(
            "%s/%s: writing its revisions or Events after the pass failed (%s: %s); "
            "reconciling again in %.0fs",
            *key,
            type(error).__name__,
            error,
            TRAILING_RETRY_SECONDS,
        )
        self.retry(key, TRAILING_RETRY_SECONDS)

    def forget(self, key: tuple[str, str]) -> None:
        """The deployment is gone: its canary window and every metric series of it."""
        self.observations.forget(key)
        self.guard_metrics.forget(key)
        self.group_capture.forget(key)
        self.validations.forget(key)

    async def _report_rejection(self, world: World, decision: Decision, error: KubeError) -> None:
        """Say on the object why the rollout stopped (the Event once per distinct refusal):
        a child the API server refuses is not the operator's error to retry in silence."""
        status = with_rejection(world, decision.status, error.message)
        if status.visible_wire() == world.status.visible_wire():
            return  # already said
        said = any(
            c.type == "Progressing"
            and c.reason == ConditionReason.CHILD_REJECTED
            and c.message == error.message
            for c in world.status.conditions
        )
        if not said:
            log.warning(
                "%s/%s: the API server refused a child: %s",
                world.namespace,
                world.name,
                error.message,
            )
        written = await self.client.apply_status(
            DSV4, world.namespace, world.name, status.to_wire()
        )
        if self.cache is not None:
            # The next pass (a child this one created may enqueue it at once) must see the
            # refusal already said, or it says it again.
            self.cache.observe(written)
        if not said:  # the status changed for another reason (a child created since)
            await self.recorder.post(
                Subject(world.namespace, world.name, world.uid),
                Note("Warning", EventReason.CHILD_REJECTED, error.message),
                world.now,
            )

    async def _secret_missing(self, namespace: str, name: str) -> bool:
        """Whether the Hub token's Secret is missing (its metadata only, never its data): a
        missing one is refused before a download Job is created (WeightsReady
        TokenSecretMissing). Without the right to read it (an older chart's RBAC) the Job
        is created as before and its pod tells."""
        if self.refusals.holds(GET_SECRETS, namespace):
            return False
        try:
            return not await self.client.exists(SECRET, namespace, name)
        except Forbidden:
            self.refusals.refused(
                GET_SECRETS, namespace, "a missing Hub token Secret shows on the Job"
            )
            return False

    async def _model(self, namespace: str, name: str) -> float | None:
        """One DSV4Model pass: gather_model -> decide_model -> act_model."""
        world = await gather_model(self.reader, namespace, name, self.clock())
        if world is None:
            self.gone((namespace, MODEL_KEY_PREFIX + name))
            return None
        events = await self._stuck_pod_events(namespace, world.weights_pods, world.now)
        secret = world.spec.token_secret if world.spec is not None else None
        missing = secret is not None and await self._secret_missing(namespace, secret.name)
        world = dataclasses.replace(
            world,
            pod_events=events,
            missing_secrets=frozenset({secret.name}) if secret and missing else frozenset(),
        )
        decision = decide_model(world, self.settings.operator_image)
        if decision.apply or decision.delete or decision.events or decision.finalizers is not None:
            log.info(
                "%s/%s %s: phase %s; apply %s; delete %s; finalizers %s; events: %s",
                namespace,
                MODEL_KIND,
                name,
                decision.status.phase,
                [o["metadata"]["name"] for o in decision.apply] or "-",
                [n for _, n in decision.delete] or "-",
                decision.finalizers if decision.finalizers is not None else "as they are",
                "; ".join(f"{n.reason}: {n.message}" for n in decision.events) or "-",
            )
        observe = self.cache.observe if self.cache is not None else ignore
        await act_model(self.client, world, decision, self.recorder, observe)
        return decision.requeue_after

    async def _stuck_pod_events(
        self, namespace: str, pods: list[PodView], now: datetime
    ) -> dict[str, PodWarnings]:
        """The Warning Events of the few pods whose status does not say why they are stuck
        (FailedMount, FailedAttachVolume, ...), read on demand, never watched, by pod name.
        Empty while Events are forbidden in the namespace: causes come from pod status only."""
        if self.refusals.holds(LIST_EVENTS, namespace):
            return {}
        try:
            return {
                name: await self._pod_warnings(namespace, name, now)
                for name in unexplained(pods, now)
            }
        except Forbidden:
            self.refusals.refused(LIST_EVENTS, namespace, "pod causes come from pod status only")
            return {}

    async def _pod_warnings(self, namespace: str, pod: str, now: datetime) -> PodWarnings:
        """A stuck pod's Warning Events, listed at most once per EVENTS_REFRESH_SECONDS."""
        key = (namespace, pod)
        cached = self._pod_events.get(key)
        if cached is not None and (now - cached.listed).total_seconds() < EVENTS_REFRESH_SECONDS:
            return cached
        listed = PodWarnings(now, tuple(await self.client.pod_warnings(namespace, pod)))
        if len(self._pod_events) >= EVENTS_CACHE_SIZE:
            self._pod_events.pop(next(iter(self._pod_events)))  # the oldest entry
        self._pod_events[key] = listed
        return listed

    async def __call__(self, key: tuple[str, str]) -> float | None:
        namespace, name = key
        if name.startswith(MODEL_KEY_PREFIX):
            return await self._model(namespace, name.removeprefix(MODEL_KEY_PREFIX))
        # The last pass's ControllerRevisions and Events first: this pass must see them.
        await self.trailing.wait(key)
        world = await gather(
            self.reader,
            namespace,
            name,
            self.clock(),
            self.observations,
            self.settings.trust,
            self.validations,
        )
        if world is None:
            self.forget(key)
            self.gone(key)
            return None
        events = await self._stuck_pod_events(world.namespace, world.pods, world.now)
        if events:
            world = dataclasses.replace(world, pod_events=events)
        recorded = [r.key for r in world.status.group_restarts]
        captured = self.group_capture.pending(key, recorded)
        world = dataclasses.replace(world, captured_restarts=captured)
        previous = world.status.guard
        if previous is not None and previous.revision:
            # Resume the window after a restart (once per key; a no-op after that).
            self.observations.resume(key, previous)
            world = dataclasses.replace(world, canary=self.observations.snapshot(key))
        decision = decide(world, self.settings)
        if decision.writes or decision.events:
            progressing = next(
                (c for c in decision.status.conditions if c.type == "Progressing"), None
            )
            log.info(
                "%s/%s: phase %s (%s); apply %s; delete %s; create %d; events: %s",
                namespace,
                name,
                decision.status.phase,
                progressing.message if progressing else None,
                [o["metadata"]["name"] for o in decision.apply] or "-",
                [n for _, n in decision.delete] or "-",
                len(decision.create),
                "; ".join(f"{n.reason}: {n.message}" for n in decision.events) or "-",
            )
        observe = self.cache.observe if self.cache is not None else ignore
        trail = functools.partial(self.trailing.start, key)
        try:
            await act(self.client, world, decision, self.recorder, observe, trail)
        except KubeError as error:
            if refused(error):
                await self._report_rejection(world, decision, error)
            raise  # the queue retries with backoff: a policy may be lifted, the spec changed
        if decision.cleared or decision.rollbacks:
            self.observations.forget(key)  # the next window starts from nothing
        self.guard_metrics.observe(
            (namespace, name),
            served_spec(world, decision.status.current_revision),
            decision.status,
            decision.rollbacks,
            [(e.key, e.role, e.kind) for e in decision.ooms],
            _plan_series(decision.plan),
        )
        return decision.requeue_after

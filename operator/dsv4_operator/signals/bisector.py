"""The culprit search's I/O (docs/bisect.md): per deployment, after a rollback, probe subsets of
the configuration delta on shadow pairs and write what it found.

Decisions are reconcile/bisecting.py's and the search is bisect/search.py's; this module only
reads the owner and its ControllerRevisions, creates and deletes shadow pairs (each with its own
router), runs the canary against each through its router's Service, and applies
`status.guard.bisect` / `status.guard.culprit` under its own field manager (the reconcile pass
never writes them: api/status.py BISECT_FIELDS). The state is
written after every probe, so a restarted operator resumes the search where it was: a probe
that was running is run again from its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from dsv4_operator import metrics
from dsv4_operator.api.bisect import BisectState, CulpritStatus
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus, parse_status
from dsv4_operator.bisect import search
from dsv4_operator.bisect.delta import Delta, compute_delta, parse_spec
from dsv4_operator.bisect.outcome import Outcome, ProbeEvidence, ProbeJudge, judge
from dsv4_operator.events import Note
from dsv4_operator.guard.observations import Key
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import (
    CONTROLLER_REVISION,
    DEPLOYMENT,
    DSV4,
    POD,
    SERVICE,
    STATEFULSET,
)
from dsv4_operator.leak.verdict import LEAK_KINDS, VerdictKind
from dsv4_operator.names import (
    API_VERSION,
    KIND,
    OPERATOR,
    PROBE_LABEL,
    ROLE_LABEL,
    ROUTER,
    revision_name,
    shadow_router_url,
)
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import EventReason
from dsv4_operator.reconcile.bisecting import (
    Step,
    culprit,
    event,
    machine,
    new_state,
    next_step,
    rolled_back_revision,
    with_machine,
)
from dsv4_operator.reconcile.recorder import EventRecorder, Subject
from dsv4_operator.render.context import OwnerRef
from dsv4_operator.render.shadow import (
    pair_gpus,
    render_shadow_pair,
    shadow_context,
    shadow_selector,
)
from dsv4_operator.signals.canary_runner import CanaryRunner

log = logging.getLogger(__name__)
FIELD_MANAGER = f"{OPERATOR}-bisect"
# Canary runs in a row in which nothing answered (each after a poll interval) before a probe
# is inconclusive: an engine that is Ready but never answers.
MAX_SILENT_RUNS = 10


@dataclass(frozen=True)
class BisectTiming:
    """How often the driver looks (tests shorten these; the search itself is not timed)."""

    poll_seconds: float = 5.0  # waiting for a shadow pair to be Ready


class Bisector:
    """One task per deployment while it has something to search (started by `ensure`)."""

    def __init__(
        self,
        client: KubeClient,
        runner: CanaryRunner,
        priority_class: str,
        timing: BisectTiming | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.client, self.runner, self.priority_class = client, runner, priority_class
        self.timing = timing or BisectTiming()
        self.now = now
        self.recorder = EventRecorder(client)
        self._tasks: dict[Key, tuple[int, asyncio.Task[None]]] = {}
        self._deltas: dict[tuple[str, str, str, str], Delta] = {}

    def ensure(self, key: Key, generation: int, seen: Obj | None = None) -> None:
        """Look at `key` now unless its task already runs for this generation (every change of
        the deployment calls this: a rollback, a restart). A new generation cancels a running
        search at once: its next step stops it and deletes its shadow pairs.

        `seen`: the deployment as the watch brought it. When it shows nothing to do (no
        rollback, no search: every create and every status change but a rollback's), no GET is
        made for it; anything else is read fresh. A `seen` older than a rollback is followed by
        the rollback's own watch event, which looks again."""
        current = self._tasks.get(key)
        running = current is not None and not current[1].done()
        if current is not None and current[0] == generation and running:
            return
        if not running and seen is not None and _idle(seen, self.now()):
            return
        if current is not None:
            current[1].cancel()
        task = asyncio.create_task(self._drive(key), name=f"bisect-{key[0]}/{key[1]}")
        self._tasks[key] = (generation, task)

    def stop(self, key: Key) -> None:
        """The deployment is gone: its shadow pairs go with it (owner references)."""
        current = self._tasks.pop(key, None)
        if current is not None:
            current[1].cancel()

    async def close(self) -> None:
        for key in list(self._tasks):
            self.stop(key)

    async def _drive(self, key: Key) -> None:
        try:
            while await self._step(key):
                pass
        except asyncio.CancelledError:
            raise
        except Exception:  # the next change of the deployment looks again
            log.exception("%s/%s: culprit search step failed", *key)

    async def _step(self, key: Key) -> bool:
        """One step of `key`'s search; False when there is nothing more to do now."""
        namespace, name = key
        owner = await self.client.get(DSV4, namespace, name)
        if owner is None:
            return False  # deleted: its shadow pairs go with it (owner references)
        status = parse_status(owner.get("status"))
        generation = int(owner["metadata"].get("generation") or 0)
        try:
            spec: DSV4DeploymentSpec | None = DSV4DeploymentSpec.model_validate(owner["spec"])
        except ValidationError:
            spec = None
        if spec is None:
            if status.guard is None or status.guard.bisect is None:
                return False
            stop = Step("stop", result="Stopped", why="the spec no longer validates")
            await self._finish(key, owner, status, stop)
            return False
        step = next_step(spec.guard.bisect, status, generation, self.now())
        if step.kind == "idle":
            return False
        if step.kind == "stop":
            await self._finish(key, owner, status, step)
        elif step.kind == "start":
            await self._start(key, owner, step, generation, spec)
        else:
            await self._advance(key, owner, status, spec)
        return True

    async def _delta(self, namespace: str, name: str, good: str, bad: str) -> Delta:
        """The units between the two stored configurations (computed once per pair)."""
        cached = self._deltas.get((namespace, name, good, bad))
        if cached is not None:
            return cached
        specs = []
        for revision in (good, bad):
            stored = await self.client.get(
                CONTROLLER_REVISION, namespace, revision_name(name, revision)
            )
            if stored is None:
                raise LookupError(f"revision {revision} of {name} is not stored")
            specs.append(stored["data"]["spec"])
        delta = compute_delta(specs[0], specs[1])
        self._deltas[(namespace, name, good, bad)] = delta
        return delta

    async def _start(
        self, key: Key, owner: Obj, step: Step, generation: int, spec: DSV4DeploymentSpec
    ) -> None:
        assert step.good is not None and step.bad is not None
        delta = await self._delta(key[0], key[1], step.good, step.bad)
        state = new_state(
            step, generation, self.now(), delta.unit_ids, spec.guard.bisect.max_probes
        )
        await self._write(key, state, None)
        units = ", ".join(delta.unit(u).name for u in delta.unit_ids) or "none"
        await self._post(
            owner,
            Note(
                "Normal",
                EventReason.BISECT_STARTED,
                f"searching {len(delta.unit_ids)} settings ({units}) between {step.good} and "
                f"{step.bad} on shadow pairs",
            ),
        )

    async def _advance(
        self, key: Key, owner: Obj, status: DSV4DeploymentStatus, spec: DSV4DeploymentSpec
    ) -> None:
        """Run the probes the search wants now (at most the parallel and GPU budgets), record
        each outcome, and write the state after each; finish when the search answered."""
        assert status.guard is not None and status.guard.bisect is not None
        state = status.guard.bisect
        delta = await self._delta(key[0], key[1], state.good_revision, state.bad_revision)
        budget = spec.guard.bisect
        one_pair = pair_gpus(shadow_context(key[1], key[0], "p0", parse_spec(delta.good), None))
        gpus = budget.max_gpus if budget.max_gpus is not None else one_pair * budget.max_parallel
        parallel = min(budget.max_parallel, max(1, gpus // max(1, one_pair)))
        running, probes = search.next_probes(machine(state), parallel, delta.refusal)
        await self._remove_pairs(key, keep={p.probe_id for p in probes})
        if running.answer is not None:
            await self._finish(key, owner, status, None, running, delta)
            return
        if one_pair > gpus:
            why = f"one shadow pair needs {one_pair} GPUs, more than maxGpus {gpus}"
            await self._finish(key, owner, status, Step("stop", result="Budget", why=why))
            return
        state = with_machine(state, running, [p.probe_id for p in probes])
        await self._write(key, state, None)
        left = budget.time_limit.delta - (self.now() - state.started_at.at)
        try:
            async with asyncio.timeout(max(0.0, left.total_seconds())):
                results = await asyncio.gather(
                    *(self._probe(key, owner, spec, delta, p) for p in probes),
                    return_exceptions=True,
                )
        except TimeoutError:
            return  # the next step ends the search: TimeLimit
        for probe, result in zip(probes, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("%s/%s: probe %s failed: %r", *key, probe.probe_id, result)
                outcome, evidence = Outcome.INCONCLUSIVE, None
            else:
                outcome, evidence = result
            metrics.BISECT_PROBES.labels(*key, outcome.value).inc()
            log.info(
                "%s/%s: probe %s (%s) %s: %s",
                *key,
                probe.probe_id,
                ", ".join(probe.units),
                outcome.value,
                evidence.detail if evidence else "no evidence",
            )
            running = search.record(running, probe.probe_id, outcome, evidence)
        await self._write(key, with_machine(state, running, []), None)

    async def _probe(
        self,
        key: Key,
        owner: Obj,
        spec: DSV4DeploymentSpec,
        delta: Delta,
        probe: search.ProbeRequest,
    ) -> tuple[Outcome, ProbeEvidence | None]:
        """Create the probe's shadow pair and its router, wait until they are Ready, run the
        canary through the router at the production concurrency (the serving spec's) until the
        sequential test decides, and delete them."""
        namespace, name = key
        owner_ref = OwnerRef(API_VERSION, KIND, name, owner["metadata"]["uid"])
        probe_spec = parse_spec(delta.spec_for(probe.units))
        ctx = shadow_context(name, namespace, probe.probe_id, probe_spec, owner_ref)
        priority = spec.guard.bisect.priority_class_name or self.priority_class
        try:
            for manifest in render_shadow_pair(ctx, probe.probe_id, priority):
                await self.client.apply(manifest)
            await self._count_pairs(key)
            model = spec.model.served_name or spec.model.profile
            rule = ProbeJudge.from_guard(spec.guard)
            leaks = responses = silent = 0
            endpoint = shadow_router_url(name, namespace, probe.probe_id, ctx.spec.router.port)
            while True:
                # Waited for before every run: a restarted pod is not Ready for a while.
                await self._ready(key, probe.probe_id)
                run = await self.runner(endpoint, model, spec)
                answered = sum(c for v, c in run.counts.items() if v != VerdictKind.ERROR)
                leaks += sum(run.counts.get(v, 0) for v in LEAK_KINDS)
                responses += answered
                silent = 0 if answered else silent + 1
                if silent:
                    await asyncio.sleep(self.timing.poll_seconds)
                outcome, evidence = judge(leaks, responses, rule)
                if outcome is None and silent >= MAX_SILENT_RUNS:
                    detail = f"the shadow pair did not answer {silent} canary runs in a row"
                    return Outcome.INCONCLUSIVE, evidence.model_copy(update={"detail": detail})
                if outcome is not None:
                    return outcome, evidence
        finally:
            await self._remove_pairs(key, only=probe.probe_id)

    async def _ready(self, key: Key, probe_id: str) -> None:
        """Until the probe's prefill, decode and router pods are Ready: a real PD pair is
        served only through a router (--pd-disaggregation), so the canary goes through it."""
        namespace, name = key
        while True:
            pods = [
                PodView.of(p)
                for p in await self.client.list(POD, namespace, shadow_selector(name, probe_id))
            ]
            ready = {pod.labels.get(ROLE_LABEL) for pod in pods if pod.ready and pod.ip}
            if ready >= {"prefill", "decode", ROUTER}:
                return
            await asyncio.sleep(self.timing.poll_seconds)

    async def _remove_pairs(
        self, key: Key, keep: set[str] | None = None, only: str | None = None
    ) -> None:
        """Delete shadow pairs and their routers: one probe's (`only`), or all but `keep`'s."""
        namespace, name = key
        for res in (DEPLOYMENT, STATEFULSET, SERVICE):
            for obj in await self.client.list(res, namespace, shadow_selector(name, only)):
                probe = obj["metadata"].get("labels", {}).get(PROBE_LABEL)
                if only is None and keep is not None and probe in keep:
                    continue
                with contextlib.suppress(Exception):
                    await self.client.delete(res, namespace, obj["metadata"]["name"])
        await self._count_pairs(key)

    async def _count_pairs(self, key: Key) -> None:
        listed = await self.client.list(STATEFULSET, key[0], shadow_selector(key[1]))
        metrics.SHADOW_PAIRS.labels(*key).set(len(listed) // 2)

    async def _finish(
        self,
        key: Key,
        owner: Obj,
        status: DSV4DeploymentStatus,
        stopped: Step | None,
        running: search.BisectState | None = None,
        delta: Delta | None = None,
    ) -> None:
        """End the search: no shadow pair left, the answer written, its Event posted."""
        assert status.guard is not None and status.guard.bisect is not None
        state = status.guard.bisect
        await self._remove_pairs(key)
        if running is None:
            running = search.stop(machine(state), stopped.why if stopped else "stopped")
        spec = owner.get("spec") or {}
        release = str((spec.get("engine") or {}).get("sglangVersion") or "")
        gpu = str((spec.get("gpu") or {}).get("product") or "")
        answer = culprit(state, running, delta, release, gpu, self.now(), stopped)
        await self._write(key, None, answer)
        self._deltas.pop((*key, state.good_revision, state.bad_revision), None)
        severity, reason, message = event(answer)
        log.info("%s/%s: culprit search ended %s: %s", *key, answer.result, answer.message)
        await self._post(owner, Note(severity, reason, message))

    async def _write(
        self, key: Key, state: BisectState | None, answer: CulpritStatus | None
    ) -> None:
        """Apply the search's fields of status.guard; what is left out is removed."""
        guard: dict[str, Any] = {}
        if state is not None:
            guard["bisect"] = state.to_wire()
        if answer is not None:
            guard["culprit"] = answer.to_wire()
        await self.client.apply_status(
            DSV4, key[0], key[1], {"guard": guard}, field_manager=FIELD_MANAGER
        )

    async def _post(self, owner: Obj, note: Note) -> None:
        meta = owner["metadata"]
        subject = Subject(meta["namespace"], meta["name"], meta["uid"])
        await self.recorder.post(subject, note, self.now())


def _idle(owner: Obj, now: datetime) -> bool:
    """Whether `owner` shows no search to start, stop or carry on (next_step's "idle")."""
    status = parse_status(owner.get("status"))
    if status.guard is not None and status.guard.bisect is not None:
        return False
    if rolled_back_revision(status) is None:
        return True  # the common case, without parsing the spec
    try:
        spec = DSV4DeploymentSpec.model_validate(owner.get("spec") or {})
    except ValidationError:
        return True  # no search runs: an invalid spec starts none (_step)
    generation = int(owner["metadata"].get("generation") or 0)
    return next_step(spec.guard.bisect, status, generation, now).kind == "idle"

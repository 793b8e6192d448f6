"""Per-deployment guard loops (I/O): the canary and Prometheus queries on their interval, the
leak taps' counters on theirs, and the engines' counters (signals/engine.py) on theirs.

Results go into Observations; the reconcile pass (the only status writer) turns them into
verdicts. The canary only runs while the deployment serves one settled revision, so every
sample is attributed to exactly that revision.

Why a hand-written supervisor and not `@kopf.daemon` / `@kopf.timer`: kopf marks both as
requiring a finalizer (`requires_finalizer=True` in `kopf.on.daemon`/`kopf.on.timer`), so
every DSV4Deployment would carry one and could not be deleted while the operator is down or
uninstalled; today the operator registers only event handlers and adds none. A kopf daemon
also lives as long as its object, while a guard loop must stop when the guard is disabled
and restart when its settings change (interval, endpoint, queries), which a daemon would
re-implement by polling its own spec; and kopf spawns daemons from its own watch, outside
the work queue that owns reconciles, so the loop would still need `wake` into the queue.
The supervisor is the part of a daemon we need (one task per key, restarted on a settings
fingerprint, cancelled on deletion and at cleanup) in under 60 lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import zlib
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from dsv4_operator import metrics
from dsv4_operator.api.limits import TAP_METRICS_PORT
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus, Phase, parse_status
from dsv4_operator.api.times import Duration
from dsv4_operator.canary.remote import TapCanaryTimedOut, TapCanaryUnavailable
from dsv4_operator.guard.observations import CANARY, ENGINE, PROMETHEUS, TAP, Key, Observations
from dsv4_operator.guard.taps import (
    Serving,
    ServingLog,
    TrafficDeltas,
    attribute,
    samples_and_leaks,
)
from dsv4_operator.kube.reader import Reader
from dsv4_operator.kube.resources import DSV4, POD
from dsv4_operator.leak.verdict import LEAK_KINDS, VerdictKind
from dsv4_operator.names import DEPLOYMENT_LABEL, ROLE_LABEL, ROUTER
from dsv4_operator.pods import PodView
from dsv4_operator.series import scope_labels
from dsv4_operator.settings import GUARD_IDLE_READ_SECONDS, GUARD_READS_AT_ONCE
from dsv4_operator.signals.bisector import Bisector
from dsv4_operator.signals.canary_runner import (
    CanaryRun,
    CanaryRunner,
    default_endpoint,
    probe_runner,
    runs_on_tap,
    tap_canary_runner,
)
from dsv4_operator.signals.engine import EngineReader
from dsv4_operator.signals.http import BoundedPages, GuardHttp, HttpxPages, Pages
from dsv4_operator.signals.prometheus import PrometheusError, instant_value
from dsv4_operator.signals.taps import pod_url, scrape
from dsv4_operator.trust import (
    Placement,
    TrustPolicy,
    effective_prometheus_url,
    spec_trust_findings,
)

log = logging.getLogger(__name__)
SETTLED_PHASES: tuple[Phase, ...] = ("Ready", "RolledBack", "Degraded")
CANARY_TAP = "canary-tap"  # the logged-once key of a tap that did not run the canary
ENGINE_RESTART = "engine-restart"  # ...of engines restarted in place, not read until Ready


def _served(status: DSV4DeploymentStatus) -> str | None:
    """The revision serving alone: as for the canary, only a settled one."""
    return status.current_revision if status.phase in SETTLED_PHASES else None


def phase(key: Key) -> float:
    """Where in its interval `key`'s rounds run, in [0, 1): fixed by the key, so deployments
    created (or found at start-up) together still run spread over the interval."""
    return zlib.crc32(f"{key[0]}/{key[1]}".encode()) / 2**32


def until_slot(now: float, interval: float, offset: float) -> float:
    """Seconds from `now` to the next time that is `offset` past a multiple of `interval`:
    a round that overran skips to the next slot instead of running late ones back to back."""
    return (offset - now) % interval


def next_stretch(stretch: int, busy: bool, most: int) -> int:
    """How many of its interval's slots a source's next read is away: the next one after a
    read that found something (new counts, a new pod, a failure), else twice as many as the
    last time, up to `most`."""
    return 1 if busy else min(2 * stretch, most)


Round = Callable[[Key, DSV4DeploymentSpec], Awaitable[bool]]


class GuardSupervisor:
    """One asyncio task per guarded deployment; restarted when its guard settings change."""

    def __init__(
        self,
        client: Reader,
        observations: Observations,
        wake: Callable[[Key], None],
        runner: CanaryRunner | None = None,
        http: GuardHttp | None = None,
        policy: TrustPolicy | None = None,
        canaries_at_once: int = 64,
        bisector: Bisector | None = None,
        tap_runner: CanaryRunner | None = None,
        idle_reads_every: float = GUARD_IDLE_READ_SECONDS,
        reads_at_once: int = GUARD_READS_AT_ONCE,
    ) -> None:
        """`http`: the operator's clients (made here, and closed by `close`, when not given);
        `canaries_at_once`: how many canary runs may be in flight across all deployments;
        `idle_reads_every`: the longest wait between reads of an idle tap or engine;
        `reads_at_once`: how many reads of pods' pages may be in flight across all
        deployments (signals/http.py BoundedPages)."""
        self.idle_reads_every = idle_reads_every
        self.client, self.observations, self.wake = client, observations, wake
        self._own_http = http is None
        self.clients = http or GuardHttp.create()
        self.runner = runner or probe_runner(self.clients.canary)
        # A router pod's tap runs the canary where it can (signals/canary_runner.py); a test
        # that gives its own `runner` and no `tap_runner` keeps every run on `runner`.
        self.tap_runner = tap_runner
        if tap_runner is None and runner is None:
            self.tap_runner = tap_canary_runner(self.clients.pods.exchanges)
        self._canary_slots = asyncio.Semaphore(canaries_at_once)
        # The last failure logged, per deployment and source.
        self._said: dict[tuple[Key, str], str] = {}
        self._traffic = TrafficDeltas()
        self._serving = ServingLog()  # the served revision as the watch saw it change
        self._read_at: dict[Key, Serving | None] = {}  # what served at each key's last tap read
        self._cuts: dict[Key, asyncio.Event] = {}  # set: read the taps now (a change)
        # URLs from the spec follow HTTP(S)_PROXY and NO_PROXY; pod IPs never go through a
        # proxy (signals/http.py).
        self.http = self.clients.spec_urls
        self.pod_http = BoundedPages(
            self.clients.pods,
            reads_at_once,
            metrics.READ_SLOT_WAIT.observe,
            metrics.READ_HELD.observe,
        )
        self.spec_pages = HttpxPages(self.http)
        self.engines = EngineReader(self.pod_http)  # engine pods: at their IPs too
        self.policy = policy or TrustPolicy()
        self._tasks: dict[Key, tuple[str, asyncio.Task[None]]] = {}
        self._started: dict[Key, datetime] = {}  # when each key's loops began
        self.bisector = bisector  # the culprit search after a rollback (signals/bisector.py)

    def saw_owner(self, key: Key, owner: Mapping[str, Any]) -> None:
        """The watch saw `key` change (or a new leader starts): a rollback may start a culprit
        search, a new generation stops the running one."""
        if self.bisector is not None:
            generation = int(owner["metadata"].get("generation") or 0)
            self.bisector.ensure(key, generation, dict(owner))

    def deleted(self, key: Key) -> None:
        """`key` is gone: its loops and its culprit search stop."""
        self.stop(key)
        if self.bisector is not None:
            self.bisector.stop(key)

    def ensure(self, key: Key, spec: DSV4DeploymentSpec | None) -> None:
        """Start, restart or stop the loop of `key` for its current spec (parsed once per
        generation by the caller; None when it does not parse)."""
        if spec is None:
            self.stop(key)  # an invalid spec is reported by reconcile; nothing to probe
            metrics.retire_sources(key, set())
            return
        # Never fetch a URL the trust policy refuses, even if the object got past admission
        # (created before the policy changed, or with the webhook down): reconcile reports it.
        if spec_trust_findings(spec, Placement(key[1], key[0]), self.policy):
            self.stop(key)
            metrics.retire_sources(key, set())
            return
        guard = spec.guard
        prometheus_url = effective_prometheus_url(spec, self.policy)
        sources = {
            source
            for source, on in (
                ("canary", guard.canary.enabled),
                ("tap", guard.tap.enabled),
                ("engine", guard.engine.enabled),
            )
            if guard.enabled and on
        }
        wanted = bool(sources) or (guard.enabled and prometheus_url is not None)
        # A digest, not the settings: what each deployment holds stays a few bytes.
        fingerprint = hashlib.blake2b(
            (
                guard.model_dump_json()
                + spec.router.model_dump_json()
                + (spec.model.served_name or "")
                + (prometheus_url or "")
            ).encode(),
            digest_size=16,
        ).hexdigest()
        current = self._tasks.get(key)
        if current is not None and (not wanted or current[0] != fingerprint):
            # New settings: the new loops' first rounds come at the key's slot, so the series
            # of the sources still on stay until then (retire_sources drops the others).
            self.stop(key, keep_series=wanted)
            current = None
        if wanted and current is None:
            task = asyncio.create_task(self._loops(key, spec), name=f"guard-{key[0]}/{key[1]}")
            self._tasks[key] = (fingerprint, task)
        # A source switched off says nothing any more: its series go (the loop that set them
        # was cancelled above, before it could set them again).
        metrics.retire_sources(key, sources)

    def saw_status(self, key: Key, status: Mapping[str, object] | None) -> None:
        """The watch saw `key`'s status: when the revision served changes, read the taps now,
        so the responses up to here are not counted with what follows."""
        if self._serving.saw(key, _served(parse_status(status))):
            cut = self._cuts.get(key)
            if cut is not None:
                cut.set()

    def stop(self, key: Key, keep_series: bool = False) -> None:
        self._traffic.retain(key, set())
        self._serving.forget(key)
        self._read_at.pop(key, None)
        self._cuts.pop(key, None)
        self.engines.forget(key)
        self._started.pop(key, None)
        if not keep_series:
            metrics.TAPS_UNREACHABLE.remove_by_labels(scope_labels(*key))
            metrics.ENGINES_UNREACHABLE.remove_by_labels(scope_labels(*key))
        for said in [s for s in self._said if s[0] == key]:
            del self._said[said]
        entry = self._tasks.pop(key, None)
        if entry is not None:
            entry[1].cancel()

    async def close(self) -> None:
        for key in list(self._tasks):
            self.stop(key)
        if self.bisector is not None:
            await self.bisector.close()
        if self._own_http:
            await self.clients.close()

    async def _loops(self, key: Key, spec: DSV4DeploymentSpec) -> None:
        self._started[key] = datetime.now(UTC)
        loops = [self._loop(key, spec, self._round, spec.guard.canary.interval, idle=False)]
        if spec.guard.tap.enabled:
            cut = self._cuts[key] = asyncio.Event()
            loops.append(self._loop(key, spec, self._tap_round, spec.guard.tap.interval, cut))
        if spec.guard.engine.enabled:
            loops.append(self._loop(key, spec, self._engine_round, spec.guard.engine.interval))
        await asyncio.gather(*loops)

    async def _loop(
        self,
        key: Key,
        spec: DSV4DeploymentSpec,
        round_: Round,
        every: Duration,
        early: asyncio.Event | None = None,
        idle: bool = True,
    ) -> None:
        """`round_` every `every` at the key's phase in it, and at once when `early` is set.
        With `idle`, a round that returns False (nothing new) stretches the wait to the next
        one (`next_stretch`), up to `idle_reads_every`; `early` or a busy round ends the
        stretch."""
        interval = every.delta.total_seconds()
        offset = phase(key) * interval
        most = max(1, int(self.idle_reads_every // interval)) if idle else 1
        early = early or asyncio.Event()
        clock = asyncio.get_running_loop()
        stretch = 1
        while True:
            wait = until_slot(clock.time(), interval, offset) + (stretch - 1) * interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(early.wait(), wait)
            woken = early.is_set()
            early.clear()
            try:
                busy = await round_(key, spec)
            except Exception:  # one bad round must not end the loop, but must be seen
                log.exception("%s/%s: guard round failed", *key)
                busy = True
            stretch = next_stretch(stretch, busy or woken, most)

    async def _tap_endpoints(self, key: Key, spec: DSV4DeploymentSpec) -> tuple[Pages, list[str]]:
        """spec.guard.tap.metricsEndpoints, else each running router pod's tap; and the client
        to read them with."""
        if spec.guard.tap.metrics_endpoints:
            return self.spec_pages, list(spec.guard.tap.metrics_endpoints)
        return self.pod_http, [tap + "/metrics" for tap in await self._router_taps(key)]

    async def _router_taps(self, key: Key) -> list[str]:
        """Each running router pod's tap, `http://pod-ip:port` (its /metrics and /canary)."""
        namespace, name = key
        listed = await self.client.list(
            POD, namespace, {DEPLOYMENT_LABEL: name, ROLE_LABEL: ROUTER}
        )
        pods = [PodView.of(pod) for pod in listed]
        return sorted(
            pod_url(pod.ip, TAP_METRICS_PORT, "")
            for pod in pods
            if pod.phase == "Running" and pod.ip
        )

    async def _tap_round(self, key: Key, spec: DSV4DeploymentSpec) -> bool:
        """New classified responses from every tap, counted for the revision that served
        them alone since the last read (guard/taps.py `attribute`), else counted apart.
        Busy (True) when a tap answered with new responses, failed, or came or went."""
        namespace, name = key
        owner = await self.client.get(DSV4, namespace, name)
        self.saw_status(key, (owner or {}).get("status"))
        http, endpoints = await self._tap_endpoints(key, spec)
        came_or_went = self._traffic.retain(key, set(endpoints))
        samples = leaks = 0
        failed: list[str] = []
        before = self._serving.now(key)
        replies = await asyncio.gather(*(scrape(http, url) for url in endpoints))
        after = self._serving.now(key)  # a change during the reads: they straddle it
        last = self._read_at.get(key)
        served = attribute(last, before) if before == after else None
        self._read_at[key] = after
        for url, (counts, error) in zip(endpoints, replies, strict=True):
            if error is not None:
                failed.append(f"{url}: {error}")
                continue
            new = self._traffic.advance((key, url), counts)
            got, leaked = samples_and_leaks(new)
            samples, leaks = samples + got, leaks + leaked
        # Not counted toward GuardBlind (the canary still sees for the guard): logged once, and
        # exported for the DSV4LeakTapUnreachable alert.
        metrics.TAPS_UNREACHABLE.labels(namespace, name).set(len(failed))
        if failed:
            self._say(key, TAP, f"leak tap /metrics unreachable: {'; '.join(failed)}")
        else:
            self._said.pop((key, TAP), None)
        if served is not None and (samples or not failed):
            self.observations.record_traffic(key, served, samples, leaks)
        elif samples:
            metrics.TRAFFIC_UNATTRIBUTED.labels(namespace, name).inc(samples)
        if samples:
            self.wake(key)
        return bool(samples or failed or came_or_went or last != after)

    async def _engine_round(self, key: Key, spec: DSV4DeploymentSpec) -> bool:
        """New counts of every engine pod, for the revision on its label; server info once per
        pod. Not counted toward GuardBlind (as for the taps): logged once, and exported.
        Busy (True) when a pod counted something new, failed, or came or went."""
        namespace, name = key
        listed = await self.client.list(POD, namespace, {DEPLOYMENT_LABEL: name})
        started = self._started.get(key, datetime.now(UTC))
        seen = await self.engines.round(key, [PodView.of(p) for p in listed], started)
        metrics.ENGINES_UNREACHABLE.labels(namespace, name).set(len(seen.failed))
        if seen.failed:
            self._say(key, ENGINE, f"engine /metrics unreachable: {'; '.join(seen.failed)}")
        else:
            self._said.pop((key, ENGINE), None)
        metrics.ENGINES_RESTARTING.labels(namespace, name).set(len(seen.restarting))
        if seen.restarting:
            notes = "; ".join(seen.restarting)
            self._say(key, ENGINE_RESTART, f"engine not read until Ready again: {notes}")
        else:
            self._said.pop((key, ENGINE_RESTART), None)
        before = self.observations.snapshot(key)
        known = set(before.server_info) if before is not None else set()
        self.observations.record_engine(key, seen.counts, seen.revisions, seen.server_info)
        if seen.counts or set(seen.server_info) != known:
            self.wake(key)
        return bool(seen.counts or seen.failed or seen.pods_changed)

    async def _round(self, key: Key, spec: DSV4DeploymentSpec) -> bool:
        namespace, name = key
        owner = await self.client.get(DSV4, namespace, name)
        status = parse_status((owner or {}).get("status"))
        revision = status.current_revision
        prometheus_url = effective_prometheus_url(spec, self.policy)
        if prometheus_url is not None:
            await self._prometheus(key, spec, prometheus_url)
        if spec.guard.canary.enabled and revision and status.phase in SETTLED_PHASES:
            endpoint = spec.guard.canary.endpoint or default_endpoint(name, namespace, spec)
            model = spec.model.served_name or spec.model.profile
            taps = await self._router_taps(key) if self.tap_runner and runs_on_tap(spec) else []
            clock = asyncio.get_running_loop()
            due = clock.time()
            async with self._canary_slots:
                metrics.CANARY_SLOT_WAIT.observe(clock.time() - due)
                await self._canary(key, spec, revision, endpoint, model, taps)
        self.wake(key)
        return True

    async def _run_canary(
        self, key: Key, spec: DSV4DeploymentSpec, endpoint: str, model: str, taps: list[str]
    ) -> CanaryRun:
        """A router pod's tap runs it when it can (`taps`: the pods' taps, tried one, chosen
        at random); else, or when that tap does not, the operator, against `endpoint`. A tap
        that took the run and did not answer in time raises TapCanaryTimedOut: the operator
        does not run it again against a router already that slow."""
        if taps and self.tap_runner is not None:
            tap = random.choice(taps)
            try:
                run = await self.tap_runner(tap, model, spec)
            except TapCanaryUnavailable as error:
                self._say(
                    key,
                    CANARY_TAP,
                    f"the tap at {tap} did not run the canary ({error}); the operator runs it "
                    f"against {endpoint}",
                )
            else:
                self._said.pop((key, CANARY_TAP), None)
                metrics.CANARY_RUNS.labels(*key, "tap").inc()
                return run
        run = await self.runner(endpoint, model, spec)
        metrics.CANARY_RUNS.labels(*key, "operator").inc()
        return run

    async def _canary(
        self,
        key: Key,
        spec: DSV4DeploymentSpec,
        revision: str,
        endpoint: str,
        model: str,
        taps: list[str],
    ) -> None:
        """One canary run, recorded for `revision`."""
        now = datetime.now(UTC)
        try:
            run = await self._run_canary(key, spec, endpoint, model, taps)
        except TapCanaryTimedOut as error:  # a failed run: the router is that slow
            self._failed(key, f"canary run by a router pod's tap: {error}", now)
        except Exception as error:  # the canary itself failed: count toward errorLimit
            # The class only: the error text may quote the reply, and status is readable
            # by anyone who can read the object.
            self._failed(key, f"canary against {endpoint}: {type(error).__name__}", now)
        else:
            counts = run.counts
            leaks = sum(counts.get(v, 0) for v in LEAK_KINDS)
            answered = sum(c for v, c in counts.items() if v != VerdictKind.ERROR)
            if answered == 0:
                failed = counts.get(VerdictKind.ERROR, 0)
                self._failed(
                    key,
                    f"canary against {endpoint}: all {failed} requests failed, the first "
                    f"with {run.first_error or 'no reason given'}",
                    now,
                )
            else:
                self._said.pop((key, CANARY), None)
                self.observations.record(key, revision, counts, leaks, now)
            for verdict, count in counts.items():
                metrics.CANARY_RESPONSES.labels(*key, revision, verdict).inc(count)
            if answered:  # a run where nothing answered is no run (DSV4CanaryNotRunning)
                metrics.CANARY_LAST_RUN.labels(*key).set(now.timestamp())

    def _say(self, key: Key, source: str, message: str) -> None:
        """Log a source's failure once per distinct message, not once per run."""
        if self._said.get((key, source)) != message:
            log.warning("%s/%s: %s", key[0], key[1], message)
            self._said[(key, source)] = message

    def _failed(self, key: Key, message: str, now: datetime) -> None:
        """Count a canary failure toward GuardBlind, and log it once."""
        self._say(key, CANARY, message)
        self.observations.record_error(key, message, now)

    async def _prometheus(self, key: Key, spec: DSV4DeploymentSpec, url: str) -> None:
        prom = spec.guard.prometheus
        try:
            leak = (
                await instant_value(self.http, url, prom.leak_rate_query)
                if prom.leak_rate_query
                else None
            )
            oom = await instant_value(self.http, url, prom.oom_query) if prom.oom_query else None
        except PrometheusError as error:
            self.observations.record_error(
                key, f"prometheus: {error}", datetime.now(UTC), source=PROMETHEUS
            )
            return
        self.observations.record_prometheus(key, leak, oom)

"""Operator metrics (prometheus-client), served on DSV4_METRICS_PORT.

A deployment's series carry `series.SCOPE` (`namespace` and the bare `deployment` name) first.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.reasons import GuardResult, RollbackReason
from dsv4_operator.series import SCOPE, scope_labels

RECONCILES = Counter("dsv4_reconciles_total", "Reconcile passes by result.", ["result"])
RECONCILE_SECONDS = Histogram("dsv4_reconcile_duration_seconds", "Duration of one reconcile pass.")
WRITES = Counter(
    "dsv4_api_writes_total",
    "API write requests the operator made, by verb and resource (flat when nothing changes).",
    ["verb", "resource"],
)
READS = Counter(
    "dsv4_api_reads_total",
    "API requests that store nothing (reads outside the watch cache, the webhook's dry runs),"
    " by verb and resource.",
    ["verb", "resource"],
)
WATCH_LISTS = Counter(
    "dsv4_watch_lists_total",
    "LIST+WATCH sessions of the watch cache (start-up, then only after 410 Gone or a break).",
    ["resource"],
)
WATCH_ERRORS = Counter(
    "dsv4_watch_errors_total", "Watch streams that failed and were restarted.", ["resource"]
)
LEADER = Gauge("dsv4_leader", "1 while this replica holds the lease and reconciles (0: standby).")
EVENTS_POSTED = Counter(
    "dsv4_events_total", "Kubernetes Events posted, new or aggregated into one.", ["action"]
)
LEAK_RATE = Gauge(
    "dsv4_leak_rate",
    "Canary tool-call leak rate in the current window.",
    [*SCOPE, "revision"],
)
WINDOW_SAMPLES = Gauge(
    "dsv4_guard_window_samples",
    "Responses in the guard's current window by source (canary, traffic: the leak taps, "
    "engine: the decode engines' tool-calling responses); live, while status.guard's counts "
    "are written only with a change a user would see.",
    [*SCOPE, "revision", "source"],
)
WINDOW_LEAKS = Gauge(
    "dsv4_guard_window_leaks",
    "Of dsv4_guard_window_samples, the leaked responses, by source.",
    [*SCOPE, "revision", "source"],
)
CANARY_RESPONSES = Counter(
    "dsv4_canary_responses",
    "Canary responses by DSML-detector verdict.",
    [*SCOPE, "revision", "verdict"],
)
CANARY_LAST_RUN = Gauge(
    "dsv4_canary_last_run_timestamp_seconds",
    "Unix time of the last completed canary run.",
    list(SCOPE),
)
CANARY_RUNS = Counter(
    "dsv4_canary_runs",
    "Canary runs by where they ran: `tap` (asked of a router pod's leak tap, against the "
    "router beside it) or `operator` (canary.endpoint set, no tap, or the tap did not run it).",
    [*SCOPE, "runner"],
)
CANARY_SLOT_WAIT = Histogram(
    "dsv4_canary_slot_wait_seconds",
    "Seconds a due canary run waited for a slot (DSV4_GUARD_CANARIES_AT_ONCE runs in flight "
    "across all deployments): waits near spec.guard.canary.interval mean the canaries fall "
    "behind their schedule.",
    buckets=(0.01, 0.1, 1, 5, 15, 30, 60, 120, 300, 600),
)
READ_SLOT_WAIT = Histogram(
    "dsv4_guard_read_slot_wait_seconds",
    "Seconds a due read of a pod's page (a leak tap's or an engine's /metrics, an engine's "
    "/server_info) waited for a slot (DSV4_GUARD_READS_AT_ONCE in flight across all "
    "deployments): waits of seconds mean the operator cannot keep up with its fleet's reads.",
    buckets=(0.001, 0.01, 0.1, 0.5, 1, 5, 15, 30, 60),
)
READ_HELD = Histogram(
    "dsv4_guard_read_seconds",
    "Seconds a read of a pod's page held its slot once it had one (connect, request, the page "
    "read; answered, failed or timed out): beside "
    "dsv4_guard_read_slot_wait_seconds, long reads mean slow pages or a busy operator, short "
    "reads with long waits more reads than DSV4_GUARD_READS_AT_ONCE.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
)
ROLLBACKS = Counter("dsv4_rollbacks", "Automatic rollbacks by reason.", [*SCOPE, "reason"])
OOM_EVENTS = Counter(
    "dsv4_oom_events", "Engine OOM events by role and kind.", [*SCOPE, "role", "kind"]
)
GUARD_OUTCOME = Gauge(
    "dsv4_guard_outcome", "1 for the guard's current outcome.", [*SCOPE, "outcome"]
)
GUARD_BLIND = Gauge("dsv4_guard_blind", "1 while the guard cannot see (GuardBlind).", list(SCOPE))
GUARD_SOURCE_ERRORS = Gauge(
    "dsv4_guard_source_errors",
    "Errors in a row of the guard's worst failing source (GuardBlind at errorLimit).",
    list(SCOPE),
)
TAPS_UNREACHABLE = Gauge(
    "dsv4_guard_taps_unreachable",
    "Leak taps whose /metrics the guard could not read in its last round.",
    list(SCOPE),
)
TRAFFIC_UNATTRIBUTED = Counter(
    "dsv4_guard_traffic_unattributed",
    "Classified responses read from the leak taps that no one revision served alone since the "
    "previous read (a rollout between two reads): counted in no revision's window.",
    list(SCOPE),
)
ENGINES_UNREACHABLE = Gauge(
    "dsv4_guard_engines_unreachable",
    "Engine pods whose /metrics the guard could not read in its last round.",
    list(SCOPE),
)
ENGINES_RESTARTING = Gauge(
    "dsv4_guard_engines_restarting",
    "Engine pods whose containers restarted in place since they last answered the guard and "
    "that did not answer in its last round (not Ready again; a group's worker, its read "
    "failed): reloading their weights, or crash-looping.",
    list(SCOPE),
)
PLAN_VERIFIED = Gauge(
    "dsv4_plan_verified",
    "1 when every engine pod of the revision reports its plan (PlanVerified=True), 0 on a "
    "mismatch; no series until they answer.",
    [*SCOPE, "revision"],
)
QUARANTINED = Gauge("dsv4_quarantined_configs", "Quarantined config hashes.", list(SCOPE))
REVISION_INFO = Gauge(
    "dsv4_revision_info",
    "1 for the revision being served, labelled from the engine config stored with it.",
    [*SCOPE, "revision", "index_k_dtype", "hicache", "multi_stream"],
)
BISECT_PROBES = Counter(
    "dsv4_bisect_probes",
    "Culprit-search probes finished, by outcome (pass, fail, inconclusive).",
    [*SCOPE, "outcome"],
)
SHADOW_PAIRS = Gauge(
    "dsv4_bisect_shadow_pairs", "Culprit-search shadow pairs that exist now.", list(SCOPE)
)
OUTCOMES = tuple(o.value for o in GuardResult)
# bisect.outcome.Outcome's values (metrics reach no guard code, which that module imports).
PROBE_OUTCOMES = ("pass", "fail", "inconclusive")
# A deployment: (namespace, name), the values of series.SCOPE.
Key = tuple[str, str]


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr)


# Every series labelled with a deployment: removed together when the deployment goes.
PER_DEPLOYMENT = (
    LEAK_RATE,
    WINDOW_SAMPLES,
    WINDOW_LEAKS,
    CANARY_RESPONSES,
    CANARY_LAST_RUN,
    CANARY_RUNS,
    ROLLBACKS,
    OOM_EVENTS,
    GUARD_OUTCOME,
    GUARD_BLIND,
    GUARD_SOURCE_ERRORS,
    TAPS_UNREACHABLE,
    TRAFFIC_UNATTRIBUTED,
    ENGINES_UNREACHABLE,
    ENGINES_RESTARTING,
    PLAN_VERIFIED,
    QUARANTINED,
    REVISION_INFO,
    BISECT_PROBES,
    SHADOW_PAIRS,
)

# The series each guard source exports (signals/supervisor.py): retired when the source is
# switched off, so an alert on them (DSV4CanaryNotRunning, DSV4LeakTapUnreachable) resolves.
SOURCE_SERIES: dict[str, tuple[Counter | Gauge, ...]] = {
    "canary": (CANARY_LAST_RUN, CANARY_RESPONSES, CANARY_RUNS),
    "tap": (TAPS_UNREACHABLE, TRAFFIC_UNATTRIBUTED),
    "engine": (ENGINES_UNREACHABLE, ENGINES_RESTARTING),
}


def retire_sources(key: Key, enabled: set[str]) -> None:
    """Remove the series of every source of the deployment `key` not in `enabled`."""
    for source, families in SOURCE_SERIES.items():
        if source not in enabled:
            for metric in families:
                metric.remove_by_labels(scope_labels(*key))


class GuardMetrics:
    """Sets the guard gauges from a status and counts new rollbacks and OOM events once.

    Series follow what they describe: a revision's leak rate and canary counts go when it is
    no longer served, every series of a deployment goes with the deployment. `revision` is the
    bare revision hash in every metric, so they join. A deployment is its (namespace, name).
    """

    def __init__(self) -> None:
        self._seen_ooms: dict[Key, set[str]] = {}
        self._served: dict[Key, tuple[str, ...]] = {}
        self._windows: dict[Key, str] = {}  # deployment -> revision of its window's series
        self._plans: dict[Key, str] = {}  # deployment -> revision of its plan-verified series

    def forget(self, key: Key) -> None:
        """The deployment is gone: drop all its series."""
        for metric in PER_DEPLOYMENT:
            metric.remove_by_labels(scope_labels(*key))
        self._seen_ooms.pop(key, None)
        self._served.pop(key, None)
        self._windows.pop(key, None)
        self._plans.pop(key, None)

    def observe(
        self,
        key: Key,
        served: DSV4DeploymentSpec | None,
        status: DSV4DeploymentStatus,
        rollbacks: list[RollbackReason],
        ooms: list[tuple[str, str, str]],
        plan: tuple[str, bool | None] | None = None,
    ) -> None:
        """`plan`: the revision PlanVerified is about and whether its engines report their
        plan (None: not all have answered yet, so no series)."""
        self._plan(key, plan)
        guard = status.guard
        window = guard.revision if guard is not None else None
        previous_window = self._windows.pop(key, None)
        if previous_window is not None and previous_window != window:
            for metric in (LEAK_RATE, WINDOW_SAMPLES, WINDOW_LEAKS):
                metric.remove_by_labels({**scope_labels(*key), "revision": previous_window})
        if guard is not None and window is not None:
            if guard.leak_rate is not None:
                LEAK_RATE.labels(*key, window).set(guard.leak_rate)
            else:  # no canary answer in this window (yet, or since it restarted)
                LEAK_RATE.remove_by_labels({**scope_labels(*key), "revision": window})
            for source, samples, leaks in (
                ("canary", guard.samples, guard.leaks),
                ("traffic", guard.traffic_samples, guard.traffic_leaks),
                ("engine", guard.engine_samples, guard.engine_leaks),
            ):
                WINDOW_SAMPLES.labels(*key, window, source).set(samples)
                WINDOW_LEAKS.labels(*key, window, source).set(leaks)
            self._windows[key] = window
        verdict = guard.last_verdict if guard is not None else None
        for outcome in OUTCOMES:
            GUARD_OUTCOME.labels(*key, outcome).set(1.0 if outcome == verdict else 0.0)
        blind = any(c.type == "GuardBlind" and c.status == "True" for c in status.conditions)
        GUARD_BLIND.labels(*key).set(1.0 if blind else 0.0)
        GUARD_SOURCE_ERRORS.labels(*key).set(guard.consecutive_errors if guard is not None else 0)
        QUARANTINED.labels(*key).set(len(status.quarantine))
        # The culprit search's series exist from the first pass (no probe, no shadow pair), so
        # its dashboard row and increase() read zero, not nothing, before any search has run.
        for probe_outcome in PROBE_OUTCOMES:
            BISECT_PROBES.labels(*key, probe_outcome)
        SHADOW_PAIRS.labels(*key)
        for reason in rollbacks:
            ROLLBACKS.labels(*key, reason.value).inc()
        seen = self._seen_ooms.setdefault(key, set())
        for event, role, kind in ooms:
            if event not in seen:
                seen.add(event)
                OOM_EVENTS.labels(*key, role, kind).inc()
        current = status.current_revision
        # `served` is the spec stored with the served revision (after a rollback it is not
        # the user's spec); None when unknown, and then the series stays as it was.
        if current and served is not None:
            engine = served.engine
            labels = (
                *key,
                current,
                str(engine.index_k_dtype),
                str(engine.hicache.enabled).lower(),
                str(engine.overlap.multi_stream).lower(),
            )
            previous = self._served.get(key)
            if previous is not None and previous != labels:
                REVISION_INFO.remove(*previous)
                old_revision = previous[len(SCOPE)]
                if old_revision != current:  # that revision's canary counts describe the past
                    CANARY_RESPONSES.remove_by_labels(
                        {**scope_labels(*key), "revision": old_revision}
                    )
            REVISION_INFO.labels(*labels).set(1.0)
            self._served[key] = labels

    def _plan(self, key: Key, plan: tuple[str, bool | None] | None) -> None:
        revision, verified = plan if plan is not None else (None, None)
        previous = self._plans.pop(key, None)
        if previous is not None and (previous != revision or verified is None):
            PLAN_VERIFIED.remove_by_labels({**scope_labels(*key), "revision": previous})
        if revision is not None and verified is not None:
            PLAN_VERIFIED.labels(*key, revision).set(1.0 if verified else 0.0)
            self._plans[key] = revision

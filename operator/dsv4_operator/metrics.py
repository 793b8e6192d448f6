"""Operator metrics (prometheus-client), served on DSV4_METRICS_PORT.

The `deployment` label is `namespace/name` of the DSV4Deployment.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.reasons import GuardResult, RollbackReason

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
    ["deployment", "revision"],
)
CANARY_RESPONSES = Counter(
    "dsv4_canary_responses",
    "Canary responses by DSML-detector verdict.",
    ["deployment", "revision", "verdict"],
)
CANARY_LAST_RUN = Gauge(
    "dsv4_canary_last_run_timestamp_seconds",
    "Unix time of the last completed canary run.",
    ["deployment"],
)
ROLLBACKS = Counter("dsv4_rollbacks", "Automatic rollbacks by reason.", ["deployment", "reason"])
OOM_EVENTS = Counter(
    "dsv4_oom_events", "Engine OOM events by role and kind.", ["deployment", "role", "kind"]
)
GUARD_OUTCOME = Gauge(
    "dsv4_guard_outcome", "1 for the guard's current outcome.", ["deployment", "outcome"]
)
GUARD_BLIND = Gauge(
    "dsv4_guard_blind", "1 while the guard cannot see (GuardBlind).", ["deployment"]
)
TAPS_UNREACHABLE = Gauge(
    "dsv4_guard_taps_unreachable",
    "Leak taps whose /metrics the guard could not read in its last round.",
    ["deployment"],
)
TRAFFIC_UNATTRIBUTED = Counter(
    "dsv4_guard_traffic_unattributed",
    "Classified responses read from the leak taps that no one revision served alone since the "
    "previous read (a rollout between two reads): counted in no revision's window.",
    ["deployment"],
)
ENGINES_UNREACHABLE = Gauge(
    "dsv4_guard_engines_unreachable",
    "Engine pods whose /metrics the guard could not read in its last round.",
    ["deployment"],
)
PLAN_VERIFIED = Gauge(
    "dsv4_plan_verified",
    "1 when every engine pod of the revision reports its plan (PlanVerified=True), 0 on a "
    "mismatch; no series until they answer.",
    ["deployment", "revision"],
)
QUARANTINED = Gauge("dsv4_quarantined_configs", "Quarantined config hashes.", ["deployment"])
REVISION_INFO = Gauge(
    "dsv4_revision_info",
    "1 for the revision being served, labelled from the engine config stored with it.",
    ["deployment", "revision", "index_k_dtype", "hicache", "multi_stream"],
)
OUTCOMES = tuple(o.value for o in GuardResult)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr)


# Every series labelled with a deployment: removed together when the deployment goes.
PER_DEPLOYMENT = (
    LEAK_RATE,
    CANARY_RESPONSES,
    CANARY_LAST_RUN,
    ROLLBACKS,
    OOM_EVENTS,
    GUARD_OUTCOME,
    GUARD_BLIND,
    TAPS_UNREACHABLE,
    TRAFFIC_UNATTRIBUTED,
    ENGINES_UNREACHABLE,
    PLAN_VERIFIED,
    QUARANTINED,
    REVISION_INFO,
)

# The series each guard source exports (signals/supervisor.py): retired when the source is
# switched off, so an alert on them (DSV4CanaryNotRunning, DSV4LeakTapUnreachable) resolves.
SOURCE_SERIES: dict[str, tuple[Counter | Gauge, ...]] = {
    "canary": (CANARY_LAST_RUN, CANARY_RESPONSES),
    "tap": (TAPS_UNREACHABLE, TRAFFIC_UNATTRIBUTED),
    "engine": (ENGINES_UNREACHABLE,),
}


def retire_sources(deployment: str, enabled: set[str]) -> None:
    """Remove the series of every source of `deployment` not in `enabled`."""
    for source, families in SOURCE_SERIES.items():
        if source not in enabled:
            for metric in families:
                metric.remove_by_labels({"deployment": deployment})


class GuardMetrics:
    """Sets the guard gauges from a status and counts new rollbacks and OOM events once.

    Series follow what they describe: a revision's leak rate and canary counts go when it is
    no longer served, every series of a deployment goes with the deployment. `revision` is the
    bare revision hash in every metric, so they join.
    """

    def __init__(self) -> None:
        self._seen_ooms: dict[str, set[str]] = {}
        self._served: dict[str, tuple[str, ...]] = {}
        self._windows: dict[str, str] = {}  # deployment -> revision of its leak-rate series
        self._plans: dict[str, str] = {}  # deployment -> revision of its plan-verified series

    def forget(self, deployment: str) -> None:
        """The deployment is gone: drop all its series."""
        for metric in PER_DEPLOYMENT:
            metric.remove_by_labels({"deployment": deployment})
        self._seen_ooms.pop(deployment, None)
        self._served.pop(deployment, None)
        self._windows.pop(deployment, None)
        self._plans.pop(deployment, None)

    def observe(
        self,
        deployment: str,
        served: DSV4DeploymentSpec | None,
        status: DSV4DeploymentStatus,
        rollbacks: list[RollbackReason],
        ooms: list[tuple[str, str, str]],
        plan: tuple[str, bool | None] | None = None,
    ) -> None:
        """`plan`: the revision PlanVerified is about and whether its engines report their
        plan (None: not all have answered yet, so no series)."""
        self._plan(deployment, plan)
        guard = status.guard
        window = guard.revision if guard is not None and guard.leak_rate is not None else None
        previous_window = self._windows.pop(deployment, None)
        if previous_window is not None and previous_window != window:
            LEAK_RATE.remove_by_labels({"deployment": deployment, "revision": previous_window})
        if guard is not None and window is not None and guard.leak_rate is not None:
            LEAK_RATE.labels(deployment, window).set(guard.leak_rate)
            self._windows[deployment] = window
        verdict = guard.last_verdict if guard is not None else None
        for outcome in OUTCOMES:
            GUARD_OUTCOME.labels(deployment, outcome).set(1.0 if outcome == verdict else 0.0)
        blind = any(c.type == "GuardBlind" and c.status == "True" for c in status.conditions)
        GUARD_BLIND.labels(deployment).set(1.0 if blind else 0.0)
        QUARANTINED.labels(deployment).set(len(status.quarantine))
        for reason in rollbacks:
            ROLLBACKS.labels(deployment, reason.value).inc()
        seen = self._seen_ooms.setdefault(deployment, set())
        for key, role, kind in ooms:
            if key not in seen:
                seen.add(key)
                OOM_EVENTS.labels(deployment, role, kind).inc()
        current = status.current_revision
        # `served` is the spec stored with the served revision (after a rollback it is not
        # the user's spec); None when unknown, and then the series stays as it was.
        if current and served is not None:
            engine = served.engine
            labels = (
                deployment,
                current,
                str(engine.index_k_dtype),
                str(engine.hicache.enabled).lower(),
                str(engine.overlap.multi_stream).lower(),
            )
            previous = self._served.get(deployment)
            if previous is not None and previous != labels:
                REVISION_INFO.remove(*previous)
                if previous[1] != current:  # that revision's canary counts describe the past
                    CANARY_RESPONSES.remove_by_labels(
                        {"deployment": deployment, "revision": previous[1]}
                    )
            REVISION_INFO.labels(*labels).set(1.0)
            self._served[deployment] = labels

    def _plan(self, deployment: str, plan: tuple[str, bool | None] | None) -> None:
        revision, verified = plan if plan is not None else (None, None)
        previous = self._plans.pop(deployment, None)
        if previous is not None and (previous != revision or verified is None):
            PLAN_VERIFIED.remove_by_labels({"deployment": deployment, "revision": previous})
        if revision is not None and verified is not None:
            PLAN_VERIFIED.labels(deployment, revision).set(1.0 if verified else 0.0)
            self._plans[deployment] = revision

"""Operator metrics (prometheus-client), served on DSV4_METRICS_PORT.

The `deployment` label is `namespace/name` of the DSV4Deployment.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.guard.policy import Outcome, RollbackReason
from dsv4_operator.names import revision_name

RECONCILES = Counter("dsv4_reconciles_total", "Reconcile passes by result.", ["result"])
RECONCILE_SECONDS = Histogram("dsv4_reconcile_duration_seconds", "Duration of one reconcile pass.")
WRITES = Counter(
    "dsv4_api_writes_total",
    "API write requests the operator made, by verb and resource (flat when nothing changes).",
    ["verb", "resource"],
)
READS = Counter(
    "dsv4_api_reads_total",
    "API reads the operator made outside its watch cache, by verb and resource.",
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
QUARANTINED = Gauge("dsv4_quarantined_configs", "Quarantined config hashes.", ["deployment"])
REVISION_INFO = Gauge(
    "dsv4_revision_info",
    "1 for the revision being served.",
    ["deployment", "revision", "hash", "index_k_dtype", "hicache", "multi_stream"],
)
OUTCOMES = tuple(o.value for o in Outcome)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr)


class GuardMetrics:
    """Sets the guard gauges from a status and counts new rollbacks and OOM events once."""

    def __init__(self) -> None:
        self._seen_ooms: set[str] = set()
        self._served: dict[str, tuple[str, ...]] = {}

    def observe(
        self,
        deployment: str,
        spec: DSV4DeploymentSpec | None,
        status: DSV4DeploymentStatus,
        rollbacks: list[RollbackReason],
        ooms: list[tuple[str, str, str]],
    ) -> None:
        guard = status.guard
        if guard is not None and guard.revision and guard.leak_rate is not None:
            LEAK_RATE.labels(deployment, guard.revision).set(guard.leak_rate)
        verdict = guard.last_verdict if guard is not None else None
        for outcome in OUTCOMES:
            GUARD_OUTCOME.labels(deployment, outcome).set(1.0 if outcome == verdict else 0.0)
        blind = any(c.type == "GuardBlind" and c.status == "True" for c in status.conditions)
        GUARD_BLIND.labels(deployment).set(1.0 if blind else 0.0)
        QUARANTINED.labels(deployment).set(len(status.quarantine))
        for reason in rollbacks:
            ROLLBACKS.labels(deployment, reason.value).inc()
        for key, role, kind in ooms:
            if key not in self._seen_ooms:
                self._seen_ooms.add(key)
                OOM_EVENTS.labels(deployment, role, kind).inc()
        current = status.current_revision
        # An invalid spec is not rolled out: the served revision keeps its labels.
        if current and spec is not None:
            engine = spec.engine
            labels = (
                deployment,
                revision_name(deployment.split("/")[-1], current),
                current,
                str(engine.index_k_dtype),
                str(engine.hicache.enabled).lower(),
                str(engine.overlap.multi_stream).lower(),
            )
            previous = self._served.get(deployment)
            if previous is not None and previous != labels:
                REVISION_INFO.remove(*previous)
            REVISION_INFO.labels(*labels).set(1.0)
            self._served[deployment] = labels

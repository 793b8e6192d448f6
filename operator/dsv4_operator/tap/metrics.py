"""The tap's /metrics: traffic by verdict, tool-calling share, classifier drops and lag, and
the latency the tap adds. Labelled by series.SCOPE only: which revision served a response is
the guard's to say (guard/taps.py: only a revision that served alone between two reads)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dsv4_operator.series import SCOPE
from dsv4_operator.tap.observe import Unobserved
from dsv4_operator.tap.worker import LAG_BUCKETS, ClassifierLink

# Added latency is small: the buckets resolve tens of microseconds.
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25)
# The loop's timers have millisecond resolution (libuv): nothing finer to tell apart.
LOOP_LAG_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class RelayTimer:
    """A histogram the relay observes once per chunk: a bucket index and two additions, no
    lock (the loop's thread alone writes it), read at scrape time. prometheus_client's
    `Histogram.observe` takes a lock per value and was a fifth of the relay's Python time per
    chunk (bench/tap.py, py-spy)."""

    __slots__ = ("bounds", "buckets", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)  # per bound (value <= bound), then +Inf
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, count) pairs as Prometheus exposes them."""
        running, pairs = 0, list[tuple[str, float]]()
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.buckets, strict=True):
            running += count
            pairs.append((bound, running))
        return pairs


class _RelayTimersCollector(Collector):
    """`dsv4_tap_added_latency_seconds`, from the relay's timers."""

    def __init__(self, timers: dict[str, RelayTimer], scope: tuple[str, str]) -> None:
        self.timers, self.labels = timers, scope

    def collect(self) -> Iterator[Metric]:
        added = HistogramMetricFamily(
            "dsv4_tap_added_latency_seconds",
            "Time the tap itself spends on the bytes it relays: `request` from a piece of a "
            "request's arrival to its sending to the router, `chunk` from a piece of a "
            "response's arrival to its write to the client.",
            labels=[*SCOPE, "phase"],
        )
        for phase, timer in self.timers.items():
            added.add_metric([*self.labels, phase], timer.cumulative(), timer.total)
        yield added


class _ClassifierCollector(Collector):
    """Reads the classifier's shared counters at scrape time."""

    def __init__(self, link: ClassifierLink, scope: tuple[str, str]) -> None:
        self.link, self.labels = link, scope

    def collect(self) -> Iterator[Metric]:
        counts = self.link.counts()
        responses = CounterMetricFamily(
            "dsv4_traffic_responses",
            "Tool-calling responses that went through the tap, by the detector's verdict. On "
            "tool_choice auto a call the engine's parser dropped looks like prose: counted ok.",
            labels=[*SCOPE, "verdict"],
        )
        for kind, value in counts.verdicts.items():
            responses.add_metric([*self.labels, kind.value], value)
        yield responses
        lag = HistogramMetricFamily(
            "dsv4_tap_classifier_lag_seconds",
            "Seconds from the end of a response to its verdict (queue wait + classification).",
            labels=list(SCOPE),
        )
        bounds = [*(str(b) for b in LAG_BUCKETS), "+Inf"]
        lag.add_metric(
            list(self.labels),
            list(zip(bounds, counts.lag_buckets, strict=True)),
            counts.lag_sum,
        )
        yield lag
        dropped = CounterMetricFamily(
            "dsv4_tap_classifier_dropped",
            "Tool-calling responses not classified (traffic went on): queue full, classifier "
            "down, or larger than the capture limit.",
            labels=[*SCOPE, "reason"],
        )
        dropped.add_metric([*self.labels, "queue_full"], self.link.dropped_full)
        dropped.add_metric([*self.labels, "classifier_down"], self.link.dropped_down)
        yield dropped
        backlog = GaugeMetricFamily(
            "dsv4_tap_classifier_backlog_bytes",
            "Bytes of tool-calling exchanges waiting to be written to the classifier's pipe "
            "(for the next batch, at most 20 ms, or for room in it; past the backlog's bound, "
            "copies are dropped).",
            labels=list(SCOPE),
        )
        backlog.add_metric(list(self.labels), self.link.waiting[1])
        yield backlog
        restarts = CounterMetricFamily(
            "dsv4_tap_classifier_restarts",
            "Classifier processes restarted after they died.",
            labels=list(SCOPE),
        )
        restarts.add_metric(list(self.labels), self.link.restarts)
        yield restarts


class TapMetrics:
    """The registry the tap serves; hot-path instruments are pre-labelled children."""

    def __init__(self, link: ClassifierLink, scope: tuple[str, str]) -> None:
        """`scope`: the values of series.SCOPE (namespace, deployment)."""
        self.registry = CollectorRegistry()
        labels = list(SCOPE)
        requests = Counter(
            "dsv4_traffic_requests",
            "Requests through the tap; tool_calling: the request offered tools.",
            [*labels, "tool_calling"],
            registry=self.registry,
        )
        self.tool_requests = requests.labels(*scope, "true")
        self.other_requests = requests.labels(*scope, "false")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        self.too_large = counter(
            "dsv4_tap_capture_skipped",
            "Tool-calling responses larger than the capture limit, forwarded unclassified.",
        ).labels(*scope)
        self.upstream_errors = counter(
            "dsv4_tap_upstream_errors",
            "Requests the tap could not forward (the router unreachable): answered 502.",
        ).labels(*scope)
        unobserved = Counter(
            "dsv4_tap_unobserved_connections",
            "Connections the tap relays but stopped reading (a HEAD request, an upgrade, bytes "
            "that are not HTTP/1.1): their exchanges after that are not classified.",
            [*labels, "reason"],
            registry=self.registry,
        )
        self.unobserved = {reason: unobserved.labels(*scope, reason) for reason in Unobserved}
        self.request_latency = RelayTimer(LATENCY_BUCKETS)
        self.chunk_latency = RelayTimer(LATENCY_BUCKETS)
        timers = {"request": self.request_latency, "chunk": self.chunk_latency}
        self.registry.register(_RelayTimersCollector(timers, scope))
        self.loop_lag = Histogram(
            "dsv4_tap_event_loop_lag_seconds",
            "How late the tap's event loop ran a timer due every 50 ms: how long bytes that "
            "arrived meanwhile could wait for the loop, busy with others (1 ms resolution). "
            "`dsv4_tap_added_latency_seconds` is the tap's time once it reads them.",
            labels,
            buckets=LOOP_LAG_BUCKETS,
            registry=self.registry,
        ).labels(*scope)
        self.registry.register(_ClassifierCollector(link, scope))

"""The tap's added-latency histogram (tap/metrics.py): the relay's lock-free timers export the
family prometheus_client's Histogram did, a value on a bucket's bound counted in that bucket."""

from __future__ import annotations

from dsv4_operator.tap.metrics import LATENCY_BUCKETS, TapMetrics
from dsv4_operator.tap.worker import ClassifierLink


def test_added_latency_is_exported_as_a_cumulative_histogram_per_phase() -> None:
    metrics = TapMetrics(ClassifierLink(), ("ns", "d"))
    for seconds in (0.00001, LATENCY_BUCKETS[0], 0.0003, 1.0):
        metrics.chunk_latency.observe(seconds)
    metrics.request_latency.observe(0.002)

    def sample(suffix: str, phase: str, **extra: str) -> float | None:
        labels = {"namespace": "ns", "deployment": "d", "phase": phase, **extra}
        return metrics.registry.get_sample_value(f"dsv4_tap_added_latency_seconds{suffix}", labels)

    assert sample("_bucket", "chunk", le=str(LATENCY_BUCKETS[0])) == 2  # on the bound: counted
    assert sample("_bucket", "chunk", le="0.0005") == 3
    assert sample("_bucket", "chunk", le=str(LATENCY_BUCKETS[-1])) == 3
    assert sample("_bucket", "chunk", le="+Inf") == sample("_count", "chunk") == 4
    assert sample("_sum", "chunk") == 0.00001 + LATENCY_BUCKETS[0] + 0.0003 + 1.0
    assert sample("_bucket", "request", le="0.001") == 0
    assert sample("_bucket", "request", le="0.002") == sample("_count", "request") == 1

"""Cutting a /metrics page to the families the guard counts parses to the same families."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dsv4_operator.guard.engine import COUNTED, parse_engine_counts
from dsv4_operator.guard.exposition import family_filter, only_families
from dsv4_operator.guard.taps import RESPONSES, parse_counts


def _engine_page() -> str:
    """A page shaped like a decode engine's: the counted families among others, some of whose
    names start like theirs (`sglang:num_requests_running`)."""
    registry = CollectorRegistry()
    drops = Counter("sglang:dsv4_tool_call_drops", "drops", ["reason"], registry=registry)
    drops.labels("unclosed").inc(3)
    drops.labels("malformed").inc(2)
    Counter("sglang:dsv4_tool_call_responses", "r", registry=registry).inc(40)
    Counter("sglang:num_requests", "finished", ["model_name"], registry=registry).labels("m").inc(
        50
    )
    Gauge("sglang:num_requests_running", "running", registry=registry).set(7)
    failed = Counter("sglang:num_transfer_failed_reqs", "failed", ["tp_rank"], registry=registry)
    failed.labels("0").inc(4)
    failed.labels("1").inc(4)
    latency = Histogram("sglang:e2e_request_latency_seconds", "latency", registry=registry)
    for value in (0.1, 0.5, 3.0):
        latency.observe(value)
    Counter("dsv4_traffic_responses", "tap", ["verdict"], registry=registry).labels("ok").inc(9)
    return generate_latest(registry).decode()


def _families(text: str, names: set[str]) -> dict[str, Any]:
    return {
        f.name: (f.type, sorted((s.name, sorted(s.labels.items()), s.value) for s in f.samples))
        for f in text_string_to_metric_families(text)
        if f.name in names
    }


def test_the_kept_lines_parse_to_the_wanted_families_as_the_whole_page_does() -> None:
    page = _engine_page()
    for names in (set(COUNTED), {RESPONSES}):
        cut = only_families(page, family_filter(names))
        assert _families(cut, names) == _families(page, names)
        assert len(_families(cut, names)) == len(names)
        assert "sglang:e2e_request_latency_seconds" not in cut  # what it is for
    assert "sglang:num_requests_running" in only_families(page, family_filter(COUNTED))


def test_the_guard_counts_from_a_cut_page_what_the_page_says() -> None:
    page = _engine_page()
    assert parse_engine_counts(page) == {
        "drops:unclosed": 3.0,
        "drops:malformed": 2.0,
        "responses": 40.0,
        "requests": 50.0,
        "transfer_failed": 4.0,  # two tensor-parallel ranks count one engine's failures
    }
    assert parse_counts(page) == {"ok": 9.0}
    assert parse_engine_counts("") == {} and parse_counts("") == {}

"""The engines' own counters (pure): an engine pod's /metrics text turned into what the guard
counts for the revision on the pod's label.

A decode engine (the server that answers the client in PD) counts the tool-calling responses
its parser parsed and those in which it dropped a call (the `toolCallDropCounter` patch:
`sglang:dsv4_tool_call_responses_total`, `sglang:dsv4_tool_call_drops_total{reason}`) and the
requests it finished (`sglang:num_requests_total`, aborted ones included). Both roles count
the KV transfers that failed (`sglang:num_transfer_failed_reqs_total`, a checksum mismatch
included). Counts are flattened into one mapping per pod, so the tap's counter arithmetic
(guard/taps.py TrafficDeltas: first read a baseline, a counter that went down a restart)
applies as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from dsv4_operator.guard.exposition import family_filter, only_families

# The counters' names without `_total`, and the flat keys they become.
TOOL_CALL_RESPONSES = "sglang:dsv4_tool_call_responses"
TOOL_CALL_DROPS = "sglang:dsv4_tool_call_drops"
REQUESTS = "sglang:num_requests"
TRANSFER_FAILED = "sglang:num_transfer_failed_reqs"
COUNTED = frozenset({TOOL_CALL_RESPONSES, TOOL_CALL_DROPS, REQUESTS, TRANSFER_FAILED})
_COUNTED_LINES = family_filter(COUNTED)
RESPONSES_KEY, REQUESTS_KEY, FAILED_KEY = "responses", "requests", "transfer_failed"
DROPS_PREFIX = "drops:"  # + the drop's reason (unclosed, malformed, ...)
# Scheduler-side counters carry a `tp_rank` label and every rank of a tensor-parallel engine
# counts the same aborted request (the mismatch is all-reduced before the abort): one rank's
# count is the engine's.
RANK_LABEL = "tp_rank"


def _ranks_as_one(series: dict[tuple[tuple[str, str], ...], float]) -> float:
    """Sum over series, counting the tensor-parallel ranks of one engine once (their max)."""
    engines: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in series.items():
        engine = tuple((k, v) for k, v in labels if k != RANK_LABEL)
        engines[engine] = max(engines.get(engine, 0.0), value)
    return sum(engines.values())


def parse_engine_counts(text: str) -> dict[str, float]:
    """An engine's /metrics as flat counts: responses, drops:<reason>, requests, transfer_failed
    (absent families give no key). Samples are matched by name, typed or not."""
    counts: dict[str, float] = {}
    failed: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(only_families(text, _COUNTED_LINES)):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name == sample.name or name not in COUNTED:
                continue
            if name == TRANSFER_FAILED:
                failed[tuple(sorted(sample.labels.items()))] = sample.value
                continue
            if name == TOOL_CALL_DROPS:
                key = DROPS_PREFIX + sample.labels.get("reason", "")
            else:
                key = RESPONSES_KEY if name == TOOL_CALL_RESPONSES else REQUESTS_KEY
            counts[key] = counts.get(key, 0.0) + sample.value
    if failed:
        counts[FAILED_KEY] = _ranks_as_one(failed)
    return counts


@dataclass(frozen=True)
class EngineCounts:
    """What the engines of one revision counted: tool-calling responses and those with a
    dropped call (decode), requests finished (decode), failed KV transfers (both roles)."""

    responses: int = 0
    drops: int = 0
    requests: int = 0
    transfer_failures: int = 0
    drop_reasons: Mapping[str, int] | None = None

    def __add__(self, other: EngineCounts) -> EngineCounts:
        reasons = dict(self.drop_reasons or {})
        for reason, count in (other.drop_reasons or {}).items():
            reasons[reason] = reasons.get(reason, 0) + count
        return EngineCounts(
            self.responses + other.responses,
            self.drops + other.drops,
            self.requests + other.requests,
            self.transfer_failures + other.transfer_failures,
            reasons or None,
        )

    def __bool__(self) -> bool:
        return bool(self.responses or self.drops or self.requests or self.transfer_failures)


def engine_counts(new: Mapping[str, float], decode: bool) -> EngineCounts:
    """New flat counts of one pod as EngineCounts: a decode pod answers the client (tool calls
    and requests are its); failed transfers count on either role."""
    failures = int(new.get(FAILED_KEY, 0))
    if not decode:
        return EngineCounts(transfer_failures=failures)
    reasons = {
        key.removeprefix(DROPS_PREFIX): int(value)
        for key, value in new.items()
        if key.startswith(DROPS_PREFIX) and int(value)
    }
    return EngineCounts(
        responses=int(new.get(RESPONSES_KEY, 0)),
        drops=sum(reasons.values()),
        requests=int(new.get(REQUESTS_KEY, 0)),
        transfer_failures=failures,
        drop_reasons=reasons or None,
    )

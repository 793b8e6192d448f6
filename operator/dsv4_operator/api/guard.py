"""The guard's settings (`spec.guard`): canary, leak tap, leak-rate and OOM verdicts, Prometheus,
bisection."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dsv4_operator.api.base import ApiModel
from dsv4_operator.api.bisect import BisectSpec
from dsv4_operator.api.limits import (
    MAX_CANARY_ROUNDS,
    MAX_CANARY_SESSIONS,
    BakeTime,
    CanaryInterval,
    OomWindow,
    TapInterval,
)
from dsv4_operator.api.roles import Resources
from dsv4_operator.api.times import Duration


class CanarySpec(ApiModel):
    """Multi-turn tool-calling canary sessions against the router."""

    enabled: bool = Field(default=True, description="Run the canary.")
    sessions: int | None = Field(
        default=None,
        ge=1,
        le=MAX_CANARY_SESSIONS,
        description="Concurrent canary sessions. Default: the decode engine's data-parallel "
        "ranks (--dp-size, else 1) x sessionsPerRank, at most the plan's sessions capacity "
        "and 64; status.guard.canarySessions says what ran (docs/guard.md).",
    )
    sessions_per_rank: int = Field(
        default=9,
        ge=1,
        le=MAX_CANARY_SESSIONS,
        description="Concurrent sessions per data-parallel rank when sessions is unset: "
        "DeepSeek-V4 with DP attention corrupted output only at 8-9 concurrent requests per "
        "rank (sglang #33397).",
    )
    rounds: int = Field(
        default=4, ge=1, le=MAX_CANARY_ROUNDS, description="Tool-calling rounds per session."
    )
    interval: CanaryInterval = Field(
        default=Duration("60s"),
        description="Time between canary runs (at least the operator's floor, "
        "10s by default; at most 24h).",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        description="Base URL to probe; defaults to the router Service. Another URL must lie "
        "under the operator's allow-list (docs/security.md).",
    )


class TapSpec(ApiModel):
    """The leak tap: a proxy in front of each router that classifies production tool calls."""

    enabled: bool = Field(
        default=True,
        description="Run the tap as a sidecar of every router pod; the router Service sends "
        "traffic through it (it forwards byte for byte and never stores content).",
    )
    interval: TapInterval = Field(
        default=Duration("5s"),
        description="How often the guard reads the taps' counters (1s to 5m); reads that find "
        "nothing new come less often, up to 30s apart by default (docs/guard.md).",
    )
    alpha: float = Field(
        default=0.01,
        gt=0.0,
        le=0.2,
        description="Bound on the chance that a revision at or below the leak-rate threshold "
        "is ever rolled back on traffic, however often it is checked (anytime-valid test).",
    )
    metrics_endpoints: list[Annotated[str, Field(max_length=2048)]] = Field(
        default_factory=list,
        max_length=16,
        description="The taps' /metrics URLs; defaults to every router pod's tap. Another "
        "URL must lie under the operator's canary allow-list (docs/security.md).",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Relay processes in the tap, on one port, each with its own classifier; "
        "its /metrics sums them. One relays about 17,000 streamed chunks/s on 0.6 of a core "
        "(docs/guard.md): add one for each such share of the router's traffic.",
    )
    # None, not a default object: a CRD default of {} would empty it on the API server.
    resources: Resources | None = Field(
        default=None,
        description="The tap container's resources; unset: per worker, requests cpu 500m and "
        "memory 256Mi, limit memory 1Gi.",
    )


class EngineSignalSpec(ApiModel):
    """The engines as a source: their own counters and what they report of their config."""

    enabled: bool = Field(
        default=True,
        description="Read every engine pod's /metrics (tool calls its parser dropped, failed "
        "KV transfers) and, once per pod, /server_info (the plan check, PlanVerified).",
    )
    interval: TapInterval = Field(
        default=Duration("5s"),
        description="How often the guard reads the engines' counters (1s to 5m); reads that "
        "find nothing new come less often, up to 30s apart by default (docs/guard.md).",
    )
    alpha: float = Field(
        default=0.01,
        gt=0.0,
        le=0.2,
        description="Bound on the chance that a revision at or below a threshold (leakRate for "
        "dropped calls, kvIntegrity for failed transfers) is ever rolled back on the engines' "
        "counts, however often they are checked (anytime-valid test).",
    )


class KvIntegritySpec(ApiModel):
    """When failed prefill-to-decode KV transfers fail a revision that has not baked."""

    threshold: float = Field(
        default=0.005,
        gt=0.0,
        lt=1.0,
        description="Failed KV transfers per request the decode engines finished that fail a "
        "revision before it bakes (anytime-valid test; after the bake the "
        "DSV4KVTransferFailures alert takes over).",
    )
    min_requests: int = Field(
        default=100,
        ge=1,
        le=1_000_000,
        description="Requests the revision's decode engines must have finished before the "
        "rate is judged (a rolling restart's few in-flight failures never decide alone).",
    )


class LeakRateSpec(ApiModel):
    """When the tool-call leak rate counts as a failure."""

    threshold: float = Field(default=0.02, gt=0.0, lt=1.0, description="Leak rate that fails.")
    min_samples: int = Field(
        default=30, ge=1, le=100_000, description="Responses needed before a verdict."
    )
    confidence: float = Field(
        default=0.999,
        gt=0.5,
        lt=1.0,
        description="One-sided confidence of the Wilson bounds (0.999: at most ~0.2 false "
        "rollbacks per 10,000 decisions at a 0.5% leak rate; see bench/guard.py).",
    )


class OomSpec(ApiModel):
    """When OOM events count as a failure."""

    max_events: int = Field(
        default=1, ge=1, le=1000, description="OOM events in the window that fail."
    )
    window: OomWindow = Field(default=Duration("10m"), description="Sliding window (1m to 24h).")


class PrometheusSpec(ApiModel):
    """Optional Prometheus source for the guard."""

    url: str | None = Field(
        default=None,
        max_length=2048,
        description="Prometheus base URL; unset uses the operator's. Another URL must lie "
        "under the operator's allow-list (docs/security.md).",
    )
    leak_rate_query: str | None = Field(
        default=None, max_length=4096, description="Instant query giving a leak rate."
    )
    oom_query: str | None = Field(
        default=None, max_length=4096, description="Instant query giving OOM events."
    )


class GuardSpec(ApiModel):
    """Detect corruption and OOM, roll back to the last known good revision."""

    enabled: bool = Field(default=True, description="Run the guard.")
    canary: CanarySpec = Field(default_factory=CanarySpec, description="Canary sessions.")
    tap: TapSpec = Field(default_factory=TapSpec, description="Leak tap on production traffic.")
    engine: EngineSignalSpec = Field(
        default_factory=EngineSignalSpec, description="The engines' own counters and config."
    )
    leak_rate: LeakRateSpec = Field(default_factory=LeakRateSpec, description="Leak-rate verdict.")
    oom: OomSpec = Field(default_factory=OomSpec, description="OOM verdict.")
    kv_integrity: KvIntegritySpec = Field(
        default_factory=KvIntegritySpec, description="KV-transfer verdict (before the bake)."
    )
    prometheus: PrometheusSpec = Field(
        default_factory=PrometheusSpec, description="Prometheus source."
    )
    no_data: Literal["Hold", "Fail"] = Field(
        default="Hold",
        description="Hold never rolls back on missing data; Fail treats it as failure.",
    )
    error_limit: int = Field(
        default=4, ge=1, le=100, description="Consecutive source errors before GuardBlind."
    )
    bake_time: BakeTime = Field(
        default=Duration("10m"),
        description="Passing time before a revision becomes last known good (0s to 168h).",
    )
    bisect: BisectSpec = Field(
        default_factory=BisectSpec,
        description="After a rollback, find the settings to blame (off by default).",
    )

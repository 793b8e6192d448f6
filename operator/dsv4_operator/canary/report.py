"""What a canary run observed: one record per response, one result per session, the report.

Two leak rates are reported. Per response: leaks / classified responses (error verdicts are
excluded: they are not evidence about corruption). Per session: sessions with a leak / sessions
that leaked or completed every round; sessions are the independent unit (rounds of one
conversation share its context), which is what the incident's "17% of sessions" counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from dsv4_operator.leak.stats import percentile, wilson_interval
from dsv4_operator.leak.verdict import LEAK_KINDS, Verdict, VerdictKind

Per = Literal["sessions", "responses"]
EXAMPLES = 5


@dataclass(frozen=True)
class ResponseRecord:
    """One round of one session: its verdict and how the request went."""

    session: int
    round: int
    verdict: Verdict
    latency_s: float | None  # None when no response came back
    status: int | None  # HTTP status, None when there was none
    attempts: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "round": self.round,
            **self.verdict.as_dict(),
            "latencySeconds": self.latency_s,
            "status": self.status,
            "attempts": self.attempts,
        }


@dataclass(frozen=True)
class SessionResult:
    """The verdicts of one session's rounds, in order (it stops at the first non-ok)."""

    index: int
    verdicts: tuple[VerdictKind, ...]
    rounds: int

    @property
    def leaked(self) -> bool:
        return any(v in LEAK_KINDS for v in self.verdicts)

    @property
    def completed(self) -> bool:
        return len(self.verdicts) == self.rounds and all(v is VerdictKind.OK for v in self.verdicts)

    @property
    def outcome(self) -> Literal["clean", "leaked", "incomplete"]:
        """`incomplete`: an error verdict ended the session before any leak."""
        if self.leaked:
            return "leaked"
        return "clean" if self.completed else "incomplete"

    def as_dict(self) -> dict[str, Any]:
        return {
            "session": self.index,
            "outcome": self.outcome,
            "verdicts": [v.value for v in self.verdicts],
        }


@dataclass(frozen=True)
class CanaryReport:
    """Everything one canary run observed; rates and intervals are derived from the records."""

    base_url: str
    model: str
    sessions: int
    rounds: int
    concurrency: int
    seed: int
    stream: bool
    confidence: float
    duration_s: float
    records: tuple[ResponseRecord, ...]
    session_results: tuple[SessionResult, ...]
    counts: dict[VerdictKind, int] = field(init=False)

    def __post_init__(self) -> None:
        counts = dict.fromkeys(VerdictKind, 0)
        for record in self.records:
            counts[record.verdict.kind] += 1
        object.__setattr__(self, "counts", counts)

    @property
    def responses(self) -> int:
        """Rounds sent, errors included."""
        return len(self.records)

    @property
    def errors(self) -> int:
        return self.counts[VerdictKind.ERROR]

    @property
    def classified(self) -> int:
        """Responses that came back and were classified (the per-response denominator)."""
        return self.responses - self.errors

    @property
    def leaks(self) -> int:
        return sum(self.counts[k] for k in LEAK_KINDS)

    @property
    def leak_rate(self) -> float:
        """Per-response leak rate (0 with no classified response)."""
        return self.leaks / self.classified if self.classified else 0.0

    @property
    def leak_interval(self) -> tuple[float, float]:
        return wilson_interval(self.leaks, self.classified, self.confidence)

    @property
    def session_leaks(self) -> int:
        return sum(1 for s in self.session_results if s.leaked)

    @property
    def sessions_observed(self) -> int:
        """Sessions that leaked or completed every round (the per-session denominator)."""
        return sum(1 for s in self.session_results if s.outcome != "incomplete")

    @property
    def session_leak_rate(self) -> float:
        observed = self.sessions_observed
        return self.session_leaks / observed if observed else 0.0

    @property
    def session_leak_interval(self) -> tuple[float, float]:
        return wilson_interval(self.session_leaks, self.sessions_observed, self.confidence)

    def rate(self, per: Per) -> tuple[int, int, float, tuple[float, float]]:
        """(leaks, trials, rate, Wilson interval) per session or per response."""
        if per == "sessions":
            return (
                self.session_leaks,
                self.sessions_observed,
                self.session_leak_rate,
                self.session_leak_interval,
            )
        return self.leaks, self.classified, self.leak_rate, self.leak_interval

    def latency(self, q: float) -> float | None:
        """Latency percentile in seconds over responses that came back with HTTP 200."""
        values = [r.latency_s for r in self.records if r.latency_s is not None and r.status == 200]
        return percentile(values, q)

    @property
    def latency_p50(self) -> float | None:
        return self.latency(50)

    @property
    def latency_p95(self) -> float | None:
        return self.latency(95)

    @property
    def latency_p99(self) -> float | None:
        return self.latency(99)

    @property
    def examples(self) -> list[ResponseRecord]:
        """Up to five leaked responses, one per verdict kind first."""
        leaks = [r for r in self.records if r.verdict.leak]
        chosen: list[ResponseRecord] = []
        seen: set[VerdictKind] = set()
        for record in leaks:
            if record.verdict.kind not in seen:
                chosen.append(record)
                seen.add(record.verdict.kind)
        chosen += [r for r in leaks if r not in chosen]
        return chosen[:EXAMPLES]

    @property
    def error_examples(self) -> list[ResponseRecord]:
        return [r for r in self.records if r.verdict.kind is VerdictKind.ERROR][:EXAMPLES]

    def as_dict(self) -> dict[str, Any]:
        def rate(per: Per) -> dict[str, Any]:
            leaks, trials, value, (low, high) = self.rate(per)
            return {"leaks": leaks, "of": trials, "rate": value, "interval": [low, high]}

        return {
            "url": self.base_url,
            "model": self.model,
            "sessions": self.sessions,
            "rounds": self.rounds,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "stream": self.stream,
            "confidence": self.confidence,
            "durationSeconds": round(self.duration_s, 3),
            "responses": self.responses,
            # Verdict names are values (as in the metrics' `verdict` label), never keys.
            "counts": [{"verdict": k.value, "count": v} for k, v in self.counts.items()],
            "responseLeakRate": rate("responses"),
            "sessionLeakRate": rate("sessions"),
            "latencySeconds": {
                "p50": self.latency_p50,
                "p95": self.latency_p95,
                "p99": self.latency_p99,
            },
            "examples": [r.as_dict() for r in self.examples],
            "errorExamples": [r.as_dict() for r in self.error_examples],
            "sessionResults": [s.as_dict() for s in self.session_results],
        }

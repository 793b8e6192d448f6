"""What the guard's sources reported, per DSV4Deployment, held in the operator's memory.

The canary and Prometheus loops write here; the reconcile pass reads a snapshot and turns it
into status (the only status writer). Counts also live in status.guard, so a restarted
operator resumes its window from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

Key = tuple[str, str]


@dataclass(frozen=True)
class Snapshot:
    """The current window of one deployment."""

    revision: str | None = None
    samples: int = 0
    leaks: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    last_run: datetime | None = None
    consecutive_errors: int = 0
    last_error: str | None = None
    prometheus_leak_rate: float | None = None
    prometheus_oom_events: float | None = None


class Observations:
    """Per-key windows; a new revision starts a new window."""

    def __init__(self) -> None:
        self._windows: dict[Key, Snapshot] = {}

    def snapshot(self, key: Key) -> Snapshot | None:
        return self._windows.get(key)

    def resume(self, key: Key, revision: str, samples: int, leaks: int) -> None:
        """Seed a window from status.guard after a restart (no-op if one exists)."""
        if key not in self._windows:
            self._windows[key] = Snapshot(revision=revision, samples=samples, leaks=leaks)

    def record(
        self, key: Key, revision: str, verdicts: dict[str, int], leaks: int, at: datetime
    ) -> None:
        current = self._windows.get(key, Snapshot())
        if current.revision != revision:
            current = Snapshot(revision=revision)
        merged = dict(current.verdicts)
        for verdict, count in verdicts.items():
            merged[verdict] = merged.get(verdict, 0) + count
        samples = sum(c for v, c in verdicts.items() if v != "error")
        self._windows[key] = replace(
            current,
            samples=current.samples + samples,
            leaks=current.leaks + leaks,
            verdicts=merged,
            last_run=at,
            consecutive_errors=0,
            last_error=None,
        )

    def record_error(self, key: Key, error: str, at: datetime) -> None:
        current = self._windows.get(key, Snapshot())
        self._windows[key] = replace(
            current,
            consecutive_errors=current.consecutive_errors + 1,
            last_error=error,
            last_run=at,
        )

    def record_prometheus(
        self, key: Key, leak_rate: float | None, oom_events: float | None
    ) -> None:
        current = self._windows.get(key, Snapshot())
        self._windows[key] = replace(
            current,
            prometheus_leak_rate=leak_rate,
            prometheus_oom_events=oom_events,
            consecutive_errors=0,
            last_error=None,
        )

    def forget(self, key: Key) -> None:
        self._windows.pop(key, None)

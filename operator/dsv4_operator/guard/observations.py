"""What the guard's sources reported, per DSV4Deployment, held in the operator's memory.

The canary and Prometheus loops write here; the reconcile pass reads a snapshot and turns it
into status (the only status writer). Counts also live in status.guard, so a restarted
operator resumes its window from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

Key = tuple[str, str]
CANARY, PROMETHEUS, TAP = "canary", "prometheus", "tap"  # the guard's sources


@dataclass(frozen=True)
class Snapshot:
    """The current window of one deployment."""

    revision: str | None = None
    samples: int = 0
    leaks: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    # Production tool-calling responses the leak taps classified while this revision served.
    traffic_samples: int = 0
    traffic_leaks: int = 0
    last_run: datetime | None = None
    prometheus_leak_rate: float | None = None
    prometheus_oom_events: float | None = None
    # Per source ("canary", "prometheus"): errors in a row and the last message. Each source
    # is counted on its own, so a source that answers never hides one that keeps failing.
    source_errors: dict[str, tuple[int, str]] = field(default_factory=dict)

    def _failing(self) -> list[tuple[str, tuple[int, str]]]:
        return sorted(self.source_errors.items(), key=lambda item: (-item[1][0], item[0]))

    @property
    def consecutive_errors(self) -> int:
        """The worst source's errors in a row."""
        failing = self._failing()
        return failing[0][1][0] if failing else 0

    @property
    def last_error(self) -> str | None:
        """Every failing source, named, the worst first."""
        text = "; ".join(f"{message} ({count} in a row)" for _, (count, message) in self._failing())
        return text or None


def _cleared(current: Snapshot, source: str) -> Snapshot:
    errors = {k: v for k, v in current.source_errors.items() if k != source}
    return replace(current, source_errors=errors)


class Observations:
    """Per-key windows; a new revision starts a new window."""

    def __init__(self) -> None:
        self._windows: dict[Key, Snapshot] = {}

    def snapshot(self, key: Key) -> Snapshot | None:
        return self._windows.get(key)

    def resume(
        self,
        key: Key,
        revision: str,
        samples: int,
        leaks: int,
        traffic_samples: int = 0,
        traffic_leaks: int = 0,
    ) -> None:
        """Seed a window from status.guard after a restart (no-op if one exists)."""
        if key not in self._windows:
            self._windows[key] = Snapshot(
                revision=revision,
                samples=samples,
                leaks=leaks,
                traffic_samples=traffic_samples,
                traffic_leaks=traffic_leaks,
            )

    def _window(self, key: Key, revision: str) -> Snapshot:
        current = self._windows.get(key, Snapshot())
        if current.revision != revision:  # a new window; a failing source keeps failing
            current = Snapshot(revision=revision, source_errors=current.source_errors)
        return current

    def record(
        self, key: Key, revision: str, verdicts: dict[str, int], leaks: int, at: datetime
    ) -> None:
        current = self._window(key, revision)
        merged = dict(current.verdicts)
        for verdict, count in verdicts.items():
            merged[verdict] = merged.get(verdict, 0) + count
        samples = sum(c for v, c in verdicts.items() if v != "error")
        self._windows[key] = _cleared(
            replace(
                current,
                samples=current.samples + samples,
                leaks=current.leaks + leaks,
                verdicts=merged,
                last_run=at,
            ),
            CANARY,
        )

    def record_traffic(self, key: Key, revision: str, samples: int, leaks: int) -> None:
        """Tool-calling responses (not errors) and leaks the taps classified for `revision`."""
        current = self._window(key, revision)
        self._windows[key] = _cleared(
            replace(
                current,
                traffic_samples=current.traffic_samples + samples,
                traffic_leaks=current.traffic_leaks + leaks,
            ),
            TAP,
        )

    def record_error(self, key: Key, error: str, at: datetime, source: str = CANARY) -> None:
        current = self._windows.get(key, Snapshot())
        count = current.source_errors.get(source, (0, ""))[0] + 1
        errors = {**current.source_errors, source: (count, error)}
        self._windows[key] = replace(current, last_run=at, source_errors=errors)

    def record_prometheus(
        self, key: Key, leak_rate: float | None, oom_events: float | None
    ) -> None:
        current = self._windows.get(key, Snapshot())
        self._windows[key] = _cleared(
            replace(current, prometheus_leak_rate=leak_rate, prometheus_oom_events=oom_events),
            PROMETHEUS,
        )

    def forget(self, key: Key) -> None:
        self._windows.pop(key, None)

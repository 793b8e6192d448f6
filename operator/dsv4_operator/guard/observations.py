"""What the guard's sources reported, per DSV4Deployment, held in the operator's memory.

The canary, Prometheus, tap and engine loops write here; the reconcile pass reads a snapshot
and turns it into status (the only status writer). Counts also live in status.guard (as of
its last write: live counts alone are not written), so a restarted operator resumes its
window from there.

The canary and the taps count for the one revision being served (the window's). The engines'
counts belong to the revision on each pod's label, whatever the window is, so they are kept
per revision; so are the pods' /server_info replies, per pod uid (read once per pod).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from dsv4_operator.api.status import GuardStatus
from dsv4_operator.guard.engine import EngineCounts
from dsv4_operator.guard.plan import ServerInfo

Key = tuple[str, str]
# The guard's sources
CANARY, PROMETHEUS, TAP, ENGINE = "canary", "prometheus", "tap", "engine"


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
    # What the engines counted, per revision on their pods' labels.
    engine: Mapping[str, EngineCounts] = field(default_factory=dict)
    # Each engine pod's /server_info, by pod uid.
    server_info: Mapping[str, ServerInfo] = field(default_factory=dict)
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
    def failing_causes(self) -> str | None:
        """Every failing source's last message, the worst first, without the counts: what
        GuardBlind says, which changes only when a cause does."""
        return "; ".join(message for _, (_, message) in self._failing()) or None

    @property
    def last_error(self) -> str | None:
        """Every failing source, named, the worst first."""
        text = "; ".join(f"{message} ({count} in a row)" for _, (count, message) in self._failing())
        return text or None

    def without(self, revision: str) -> Snapshot:
        """This snapshot with nothing of `revision` (released from quarantine: a fresh window)."""
        engine = {r: c for r, c in self.engine.items() if r != revision}
        if self.revision == revision:
            return Snapshot(engine=engine, server_info=self.server_info)
        return replace(self, engine=engine)


def _cleared(current: Snapshot, source: str) -> Snapshot:
    errors = {k: v for k, v in current.source_errors.items() if k != source}
    return replace(current, source_errors=errors)


class Observations:
    """Per-key windows; a new revision starts a new window."""

    def __init__(self) -> None:
        self._windows: dict[Key, Snapshot] = {}
        self._resumed: set[Key] = set()

    def snapshot(self, key: Key) -> Snapshot | None:
        return self._windows.get(key)

    def resume(self, key: Key, previous: GuardStatus) -> None:
        """Seed a window from status.guard after a restart, once per key: what status held
        is added to what the loops recorded since for the same revision."""
        if key in self._resumed or not previous.revision:
            return
        self._resumed.add(key)
        revision = previous.revision
        current = self._windows.get(key)
        if current is not None and current.revision not in (None, revision):
            return  # the loops moved on to another revision already
        current = current or Snapshot()
        engine = dict(current.engine)
        engine[revision] = engine.get(revision, EngineCounts()) + EngineCounts(
            responses=previous.engine_samples,
            drops=previous.engine_leaks,
            requests=previous.kv_requests,
            transfer_failures=previous.kv_failures,
        )
        self._windows[key] = replace(
            current,
            revision=revision,
            samples=current.samples + previous.samples,
            leaks=current.leaks + previous.leaks,
            traffic_samples=current.traffic_samples + previous.traffic_samples,
            traffic_leaks=current.traffic_leaks + previous.traffic_leaks,
            engine=engine,
        )

    def _window(self, key: Key, revision: str) -> Snapshot:
        current = self._windows.get(key, Snapshot())
        if current.revision != revision:
            # A new window; a failing source keeps failing, the engines' counts stay with
            # their revisions.
            current = Snapshot(
                revision=revision,
                source_errors=current.source_errors,
                engine=current.engine,
                server_info=current.server_info,
            )
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

    def record_engine(
        self,
        key: Key,
        counts: Mapping[str, EngineCounts],
        revisions: Collection[str],
        server_info: Mapping[str, ServerInfo],
    ) -> None:
        """New engine counts per revision; `revisions` those that still have engine pods (the
        others' counts are dropped unless the window is theirs); each pod's server info by
        uid (replaces the previous map: pods that are gone are forgotten)."""
        current = self._windows.get(key, Snapshot())
        keep = set(revisions) | ({current.revision} if current.revision else set())
        engine = {r: c for r, c in current.engine.items() if r in keep}
        for revision, new in counts.items():
            engine[revision] = engine.get(revision, EngineCounts()) + new
        self._windows[key] = replace(current, engine=engine, server_info=dict(server_info))

    def forget(self, key: Key) -> None:
        self._windows.pop(key, None)
        self._resumed.discard(key)

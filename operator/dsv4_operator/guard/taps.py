"""The leak taps' counters (pure): new classified responses, and the revision they belong to.

A tap counts `dsv4_traffic_responses_total{verdict}` since it started. The guard scrapes each
tap (signals/taps.py) every `spec.guard.tap.interval` and keeps, per tap URL, the last counts:
the difference is what the taps saw since. The first scrape of a URL only sets its baseline
(what came before may belong to an earlier revision); a counter that went down is a restarted
tap, whose new count is all new.

Which revision served them: the taps cannot see it (a response names no revision), and a read
every interval cannot place a change of revision that falls between two reads. So the guard
keeps a log of the served revision as the watch sees it change (`ServingLog`: a revision only
while it serves alone and settled, None during a rollout, and a count of the changes), reads
every tap at each change besides every interval, and gives the responses new since the last
read to a revision only when that revision served, alone, at both reads and nothing changed in
between (`attribute`). What came in across a change is counted apart, never charged to either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from dsv4_operator.guard.exposition import family_filter, only_families
from dsv4_operator.leak.verdict import LEAK_KINDS, VerdictKind

RESPONSES = "dsv4_traffic_responses"  # the family name (the parser drops `_total`)
_RESPONSES_LINES = family_filter([RESPONSES])


def parse_counts(text: str) -> dict[str, float]:
    """Verdict -> count of one tap's /metrics (series of several deployments summed)."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(only_families(text, _RESPONSES_LINES)):
        if family.name != RESPONSES:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                verdict = sample.labels.get("verdict", "")
                counts[verdict] = counts.get(verdict, 0.0) + sample.value
    return counts


class TrafficDeltas:
    """Per tap URL, the counts seen last; `advance` returns what is new. Kept by owner (a
    deployment) first, so that forgetting one owner's gone sources does not scan every
    deployment's: each round of each deployment calls `retain`."""

    def __init__(self) -> None:
        self._last: dict[object, dict[str, dict[str, float]]] = {}

    def advance(
        self, tap: tuple[object, str], counts: Mapping[str, float], fresh: bool = False
    ) -> dict[str, float]:
        """`tap` is (owner, URL); the counts scraped now; returns what is new since last.
        `fresh`: the source started after the reader, so nothing of it was counted before and
        its first read is all new (an engine pod, whose counts are all its revision's)."""
        owner, url = tap
        sources = self._last.setdefault(owner, {})
        last = sources.get(url)
        sources[url] = dict(counts)
        if last is None:
            return {k: v for k, v in counts.items() if v} if fresh else {}
        new: dict[str, float] = {}
        for verdict, value in counts.items():
            before = last.get(verdict, 0.0)
            new[verdict] = value if value < before else value - before
        return {v: n for v, n in new.items() if n}

    def knows(self, owner: object, url: str) -> bool:
        """Whether `url` of `owner` has been read (and kept) before."""
        return url in self._last.get(owner, {})

    def retain(self, owner: object, urls: set[str]) -> bool:
        """Forget `owner`'s sources other than `urls` (router pods that are gone); True when
        `urls` are not the sources it had (one came, or one went)."""
        sources = self._last.get(owner, {})
        changed = sources.keys() != urls
        kept = {url: counts for url, counts in sources.items() if url in urls}
        if kept:
            self._last[owner] = kept
        else:
            self._last.pop(owner, None)
        return changed


def samples_and_leaks(new: Mapping[str, float]) -> tuple[int, int]:
    """(responses answered, leaked) among new verdict counts; errors are not samples."""
    samples = sum(int(n) for v, n in new.items() if v != VerdictKind.ERROR.value)
    leaks = sum(int(new.get(kind.value, 0)) for kind in LEAK_KINDS)
    return samples, leaks


@dataclass(frozen=True)
class Serving:
    """What served, as the watch saw it: `revision` alone and settled (None during a rollout
    or before any settles), after `changes` changes of it."""

    revision: str | None
    changes: int


class ServingLog:
    """Per owner, the served revision and how many times it changed (pure bookkeeping)."""

    def __init__(self) -> None:
        self._now: dict[object, Serving] = {}

    def saw(self, owner: object, revision: str | None) -> bool:
        """Record what serves now; True when it changed (a tap read belongs here)."""
        before = self._now.get(owner)
        if before is not None and before.revision == revision:
            return False
        self._now[owner] = Serving(revision, before.changes + 1 if before else 0)
        return before is not None

    def now(self, owner: object) -> Serving | None:
        return self._now.get(owner)

    def forget(self, owner: object) -> None:
        self._now.pop(owner, None)


def attribute(before: Serving | None, now: Serving | None) -> str | None:
    """The revision the responses read between two reads (at `before` and `now`) belong to:
    the one that served alone at both with no change in between; None when none did."""
    if before is None or now is None or now.revision is None:
        return None
    return now.revision if before == now else None

"""The tap's classifier: a separate process fed through a bounded queue (fail-open).

The proxy never waits for it: `ClassifierLink.submit` is a non-blocking put that counts a
drop when the queue is full or the process is down; the supervisor restarts a dead process
(with a new queue: a process killed while reading may leave the old one locked). Verdicts and
the lag from submit to verdict are counted in shared memory that only the worker writes.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsv4_operator.probe.verdict import VerdictKind
from dsv4_operator.tap.classify import classify_exchange

VERDICTS: tuple[VerdictKind, ...] = tuple(VerdictKind)
#: Upper bounds (seconds) of the classifier-lag histogram buckets; +Inf is implied.
LAG_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)
QUEUE_SIZE = 1024

# Layout of the shared counters: one per verdict, then lag buckets, +Inf, lag sum (micros).
_LAG_AT = len(VERDICTS)
_SUM_AT = _LAG_AT + len(LAG_BUCKETS) + 1
_SLOTS = _SUM_AT + 1

Exchange = tuple[float, bytes, bytes]  # (submitted at, request body, response body)


#: The classifier's niceness: when it and the relay both want the tap's CPU, the relay runs
#: first (a verdict may wait, a streamed chunk should not; bench/tap.py: p99 per chunk at 256
#: streams +2.9 ms instead of +9.0). When it cannot keep up, the queue's drops count it.
CLASSIFIER_NICENESS = 10


def _serve(inbox: Any, counters: Any) -> None:
    """The worker process: classify until the None sentinel."""
    os.nice(CLASSIFIER_NICENESS)
    index = {kind: i for i, kind in enumerate(VERDICTS)}
    while True:
        item: Exchange | None = inbox.get()
        if item is None:
            return
        submitted, request, response = item
        verdict = classify_exchange(request, response)
        lag = time.monotonic() - submitted
        if verdict is not None:
            counters[index[verdict]] += 1
        bucket = next((i for i, bound in enumerate(LAG_BUCKETS) if lag <= bound), len(LAG_BUCKETS))
        counters[_LAG_AT + bucket] += 1
        counters[_SUM_AT] += int(lag * 1_000_000)


@dataclass(frozen=True)
class ClassifierCounts:
    """A snapshot of the worker's counters."""

    verdicts: dict[VerdictKind, int]
    lag_buckets: tuple[int, ...]  # cumulative counts per LAG_BUCKETS bound, then +Inf
    lag_sum: float


class ClassifierLink:
    """The proxy's side: submit without waiting, drops counted, restart when dead."""

    def __init__(self, queue_size: int = QUEUE_SIZE) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._queue_size = queue_size
        # Survives restarts: verdicts counted by earlier workers stay counted.
        self._counters: Sequence[int] = self._ctx.Array("q", _SLOTS, lock=False)
        self._inbox: Any = None
        self._process: multiprocessing.context.SpawnProcess | None = None
        self.dropped_full = 0
        self.dropped_down = 0
        self.restarts = 0

    def start(self) -> None:
        self._inbox = self._ctx.Queue(self._queue_size)
        self._process = self._ctx.Process(
            target=_serve, args=(self._inbox, self._counters), name="dsv4-tap-classifier"
        )
        self._process.daemon = True
        self._process.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def ensure_running(self) -> bool:
        """Restart a dead worker; True when it had to."""
        if self.alive():
            return False
        if self._inbox is not None:
            self._inbox.cancel_join_thread()  # never block on a queue nobody reads
            self._inbox.close()
        self.restarts += 1
        self.start()
        return True

    def submit(self, request: bytes, response: bytes) -> bool:
        """Hand one exchange over; False (and counted) when it had to be dropped."""
        if not self.alive():
            self.dropped_down += 1
            return False
        try:
            self._inbox.put_nowait((time.monotonic(), request, response))
        except queue.Full:
            self.dropped_full += 1
            return False
        return True

    def counts(self) -> ClassifierCounts:
        raw = list(self._counters)
        verdicts = {kind: raw[i] for i, kind in enumerate(VERDICTS)}
        running, cumulative = 0, []
        for value in raw[_LAG_AT:_SUM_AT]:
            running += value
            cumulative.append(running)
        return ClassifierCounts(verdicts, tuple(cumulative), raw[_SUM_AT] / 1_000_000)

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.is_alive():
            try:
                self._inbox.put_nowait(None)
            except queue.Full:
                self._process.terminate()
            self._process.join(5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
        self._inbox.cancel_join_thread()
        self._inbox.close()
        self._process = None

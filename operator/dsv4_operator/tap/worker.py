"""The tap's classifier: a separate process fed through a pipe the relay writes without waiting
(fail-open).

`ClassifierLink.submit` runs on the relay's event loop: a framed exchange goes into the pipe
with a non-blocking write, at once after a quiet spell, else with the others of its burst
(one `writev` within 20 ms: each write wakes the classifier, which then competes with the
relay for its CPU). When the pipe is full the frames wait in a backlog bounded in bytes (the
loop drains it when the pipe has room); past the bound, or with the classifier dead (the pipe
broken), the copy is dropped and counted, never the traffic. No thread and no pickling
stand between the relay and the pipe: a feeder thread competed with the relay for the GIL.
The supervisor restarts a dead process with a new pipe. Verdicts and the lag from submit to
verdict are counted in shared memory that only the worker writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import struct
import time
from collections import deque
from collections.abc import MutableSequence
from dataclasses import dataclass
from itertools import islice

from dsv4_operator.leak.verdict import VerdictKind
from dsv4_operator.tap.classify import classify_exchange

VERDICTS: tuple[VerdictKind, ...] = tuple(VerdictKind)
#: Upper bounds (seconds) of the classifier-lag histogram buckets; +Inf is implied.
LAG_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)
#: Bytes of exchanges that may wait for the pipe (beyond what the pipe holds) before copies
#: are dropped: the tap's memory stays bounded whatever the classifier does.
BACKLOG_LIMIT = 16 << 20
#: The pipe's capacity asked for (Linux allows an unprivileged process up to 1 MiB).
PIPE_SIZE = 1 << 20
#: Copies that follow one another within this long are written together (one system call, one
#: wake-up of the classifier); a verdict waits at most this much longer.
FLUSH_SECONDS = 0.02
#: ...unless this many bytes wait: then at once.
FLUSH_BYTES = 64 << 10
_IOV_MAX = os.sysconf("SC_IOV_MAX")

# Layout of the shared counters: one per verdict, then lag buckets, +Inf, lag sum (micros).
_LAG_AT = len(VERDICTS)
_SUM_AT = _LAG_AT + len(LAG_BUCKETS) + 1
_SLOTS = _SUM_AT + 1

#: A frame on the pipe: this header (submitted at on the monotonic clock, request length,
#: response length), then the request body, then the response body.
_HEADER = struct.Struct("<dII")

#: The classifier's niceness: when it and the relay both want the tap's CPU, the relay runs
#: first (a verdict may wait, a streamed chunk should not; bench/tap.py: p99 per chunk at 256
#: streams +2.9 ms instead of +9.0). When it cannot keep up, the backlog's drops count it.
#: Not SCHED_IDLE: that starved the classifier of any CPU something else wanted (bench/tap.py at
#: saturation on a shared machine: 42-83% of the copies dropped, against 5-25% at niceness 10).
CLASSIFIER_NICENESS = 10


def _serve(inbox: multiprocessing.connection.Connection, counters: MutableSequence[int]) -> None:
    """The worker process: classify each frame until the pipe ends (the tap closed it)."""
    os.nice(CLASSIFIER_NICENESS)
    index = {kind: i for i, kind in enumerate(VERDICTS)}
    fd = os.dup(inbox.fileno())
    inbox.close()
    with open(fd, "rb", buffering=PIPE_SIZE) as stream:
        while len(header := stream.read(_HEADER.size)) == _HEADER.size:
            submitted, request_size, response_size = _HEADER.unpack(header)
            request, response = stream.read(request_size), stream.read(response_size)
            if len(request) != request_size or len(response) != response_size:
                return  # the tap went away mid-frame
            verdict = classify_exchange(request, response)
            lag = time.monotonic() - submitted
            if verdict is not None:
                counters[index[verdict]] += 1
            bucket = next(
                (i for i, bound in enumerate(LAG_BUCKETS) if lag <= bound), len(LAG_BUCKETS)
            )
            counters[_LAG_AT + bucket] += 1
            counters[_SUM_AT] += int(lag * 1_000_000)


@dataclass(frozen=True)
class ClassifierCounts:
    """A snapshot of the worker's counters."""

    verdicts: dict[VerdictKind, int]
    lag_buckets: tuple[int, ...]  # cumulative counts per LAG_BUCKETS bound, then +Inf
    lag_sum: float


@dataclass(frozen=True)
class Worker:
    """A classifier process and the write end of its pipe (non-blocking)."""

    process: multiprocessing.context.SpawnProcess
    fd: int


class ClassifierLink:
    """The relay's side: submit without waiting, drops counted, a dead worker replaced.

    `submit` and `adopt` run on the event loop (the backlog drains through it); `spawn`, the
    slow part of a restart, may run in a thread.
    """

    def __init__(
        self, backlog_limit: int = BACKLOG_LIMIT, flush_seconds: float = FLUSH_SECONDS
    ) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self.backlog_limit = backlog_limit
        self.flush_seconds = flush_seconds
        # Survives restarts: verdicts counted by earlier workers stay counted.
        self._counters: MutableSequence[int] = self._ctx.Array("q", _SLOTS, lock=False)
        self._worker: Worker | None = None
        self._broken = False  # the pipe's read end is gone: the worker died
        self._backlog: deque[memoryview] = deque()
        self._backlog_size = 0
        self._draining: asyncio.AbstractEventLoop | None = None  # the loop draining the backlog
        self._flush_due: asyncio.TimerHandle | None = None
        self._flushed_at = -math.inf
        self._unflushed = 0  # bytes appended since the last flush
        self.dropped_full = 0
        self.dropped_down = 0
        self.restarts = 0

    def spawn(self) -> Worker:
        """Start a classifier process with a new pipe (not yet the one `submit` writes to)."""
        reader, writer = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=_serve, args=(reader, self._counters), name="dsv4-tap-classifier"
        )
        process.daemon = True
        process.start()
        reader.close()  # the worker holds the only read end: its death breaks the pipe
        fd = os.dup(writer.fileno())
        writer.close()
        os.set_blocking(fd, False)
        with contextlib.suppress(OSError):  # a smaller pipe only means an earlier backlog
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        return Worker(process, fd)

    def adopt(self, worker: Worker) -> None:
        """Submit to `worker` from now on; the previous one's pipe and backlog are let go."""
        if self._worker is not None:
            self.restarts += 1
            self._hang_up()
        self._worker, self._broken = worker, False

    def start(self) -> None:
        self.adopt(self.spawn())

    @property
    def pid(self) -> int | None:
        return self._worker.process.pid if self._worker is not None else None

    def alive(self) -> bool:
        return self._worker is not None and self._worker.process.is_alive()

    @property
    def waiting(self) -> tuple[int, int]:
        """(copies, bytes) waiting for the next flush or for room in the pipe."""
        return len(self._backlog), self._backlog_size

    def submit(self, request: bytes, response: bytes) -> bool:
        """Hand one exchange over; False (and counted) when it had to be dropped.

        A copy that follows another within `flush_seconds` waits for the next flush, which
        writes every waiting copy at once: under load one write (and one wake-up of the
        classifier, on the relay's CPU) per flush instead of per response."""
        if self._worker is None or self._broken:
            self.dropped_down += 1
            return False
        frame = _HEADER.pack(time.monotonic(), len(request), len(response)) + request + response
        if self._backlog_size + len(frame) > self.backlog_limit:
            self.dropped_full += 1
            return False
        self._backlog.append(memoryview(frame))
        self._backlog_size += len(frame)
        self._unflushed += len(frame)
        if self._draining is not None:
            return True  # written as the pipe makes room
        since = time.monotonic() - self._flushed_at
        if since >= self.flush_seconds or self._unflushed >= FLUSH_BYTES:
            self._flush()  # the first copy after a quiet spell goes at once, as a large batch
        elif self._flush_due is None:
            loop = asyncio.get_running_loop()
            self._flush_due = loop.call_later(self.flush_seconds - since, self._flush)
        return not self._broken

    def _flush(self) -> None:
        """Write what waits; what the pipe cannot take now waits for room (the loop's
        writer callback drains it)."""
        if self._flush_due is not None:
            self._flush_due.cancel()
            self._flush_due = None
        self._flushed_at = time.monotonic()
        self._unflushed = 0
        if self._worker is None:
            return
        self._write_backlog()
        if self._backlog and not self._broken and self._draining is None:
            self._draining = asyncio.get_running_loop()
            self._draining.add_writer(self._worker.fd, self._drain)

    def _write_backlog(self) -> None:
        """As much of the backlog as the pipe takes, in order (the worker reads a stream of
        frames: a frame partly written is finished before any other)."""
        assert self._worker is not None
        while self._backlog:
            try:
                written = os.writev(self._worker.fd, list(islice(self._backlog, _IOV_MAX)))
            except BlockingIOError:
                return
            except OSError:  # EPIPE: the worker is gone; the supervisor replaces it
                self._broken = True
                self._drop_backlog()
                return
            self._backlog_size -= written
            while written:
                head = self._backlog[0]
                if written < len(head):
                    self._backlog[0] = head[written:]
                    return
                written -= len(head)
                self._backlog.popleft()

    def _drain(self) -> None:
        """The pipe has room: write what waits, in order."""
        self._write_backlog()
        if not self._backlog:
            self._stop_draining()

    def _stop_draining(self) -> None:
        if self._draining is not None and self._worker is not None:
            self._draining.remove_writer(self._worker.fd)
        self._draining = None

    def _drop_backlog(self) -> None:
        """The frames that wait will never reach this worker: dropped, counted."""
        self._stop_draining()
        if self._flush_due is not None:
            self._flush_due.cancel()
            self._flush_due = None
        self._unflushed = 0
        self.dropped_down += len(self._backlog)
        self._backlog.clear()
        self._backlog_size = 0

    def _hang_up(self) -> None:
        """Close the current pipe (what it holds is still read), drop what waits for it."""
        self._drop_backlog()
        if self._worker is not None:
            os.close(self._worker.fd)

    def counts(self) -> ClassifierCounts:
        raw = list(self._counters)
        verdicts = {kind: raw[i] for i, kind in enumerate(VERDICTS)}
        running, cumulative = 0, []
        for value in raw[_LAG_AT:_SUM_AT]:
            running += value
            cumulative.append(running)
        return ClassifierCounts(verdicts, tuple(cumulative), raw[_SUM_AT] / 1_000_000)

    async def close(self) -> None:
        """Write what waits and the pipe takes, close the pipe (the worker ends after what it
        holds) and wait for the worker."""
        if self._worker is None:
            return
        if not self._broken:
            self._write_backlog()
        self._hang_up()
        process, self._worker = self._worker.process, None
        await asyncio.to_thread(_end, process)


def _end(process: multiprocessing.context.SpawnProcess) -> None:
    process.join(5)
    if process.is_alive():
        process.kill()
        process.join(5)

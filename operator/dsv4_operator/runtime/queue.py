"""A keyed work queue: coalesced keys, bounded workers, periodic resync, per-key backoff.

Watch events only enqueue keys; reconciles run here, so a burst of child events costs one
pass, a failing object backs off (and resets when its generation changes) instead of
storming, and one bad object never blocks the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
Reconcile = Callable[[Key], Awaitable[float | None]]


class WorkQueue:
    """asyncio work queue; `reconcile` returns seconds until it wants to look again."""

    def __init__(
        self,
        reconcile: Reconcile,
        *,
        workers: int = 4,
        resync_seconds: float = 300.0,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
    ) -> None:
        self._reconcile = reconcile
        self._workers = workers
        self._resync = resync_seconds
        self._base, self._max = backoff_base, backoff_max
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        self._again: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._generation: dict[Key, int] = {}
        self._known: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}

    def add(self, key: Key, generation: int | None = None) -> None:
        """Reconcile `key` soon; a failing key waits for its backoff unless its spec changed."""
        self._known.add(key)
        if generation is not None and self._generation.get(key) != generation:
            self._generation[key] = generation
            self._failures.pop(key, None)
        if key in self._failures:
            return  # its backoff timer brings it back
        self._enqueue(key)

    def _enqueue(self, key: Key) -> None:
        if key in self._running:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: Key, delay: float) -> None:
        old = self._timers.pop(key, None)
        if old is not None and old.when() <= asyncio.get_running_loop().time() + delay:
            self._timers[key] = old  # an earlier wake-up is already set
            return
        if old is not None:
            old.cancel()
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        if key in self._known:
            self._enqueue(key)

    def forget(self, key: Key) -> None:
        """The object is gone: stop resyncing and retrying it."""
        self._known.discard(key)
        self._failures.pop(key, None)
        self._generation.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def gone(self, key: Key) -> None:
        """A pass found no object for `key`: forget it (a key is queued by its children's
        events too, and the garbage collector deletes those after the owner: every deleted
        deployment was resynced for the operator's life), unless an event came for it while
        that pass ran (created again: the pass that follows finds it)."""
        if key not in self._again:
            self.forget(key)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._running.add(key)
            try:
                again = await self._reconcile(key)
                self._failures.pop(key, None)
                if again is not None:
                    self.add_after(key, again)
            except asyncio.CancelledError:
                raise
            except Exception:  # one object's failure must not stop the others
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = min(self._base * 2 ** (failures - 1), self._max)
                log.exception(
                    "reconcile of %s/%s failed (%d in a row); retrying in %.0fs",
                    *key,
                    failures,
                    delay,
                )
                self.add_after(key, delay)
            finally:
                self._running.discard(key)
                if key in self._again:
                    self._again.discard(key)
                    self._enqueue(key)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self._resync)
            for key in sorted(self._known):
                if key not in self._failures:  # failing keys follow their backoff
                    self.add(key)

    async def run(self) -> None:
        tasks = [asyncio.create_task(self._work()) for _ in range(self._workers)]
        tasks.append(asyncio.create_task(self._resync_loop()))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for timer in self._timers.values():
                timer.cancel()

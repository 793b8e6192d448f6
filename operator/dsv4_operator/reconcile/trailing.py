"""The writes a pass leaves behind (its ControllerRevisions and Events), run after the pass so
that the worker takes its next key without waiting on them; in order per key.

Why: nothing in a pass reads them. A ControllerRevision is read only once its revision has run
(a bake, a rollback, a culprit search), an Event only by people. Awaited in the pass, they
were one more round trip per create for every worker: at 100 deployments created at once,
their children took 1.38x the time of a controller that makes neither with them in the pass,
1.29x with them after it (median of 3 rounds each; docs/architecture.md, "What a create
costs the API server").

The key's next pass waits for them before it reads the cache, so it sees the stored revision
(and does not create it again) and its Events come after the previous pass's.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

Key = tuple[str, str]
Writes = Coroutine[Any, Any, None]


class Trailing:
    """At most one task of trailing writes per key; `on_failure` is told of one that failed."""

    def __init__(self, on_failure: Callable[[Key, Exception], None]) -> None:
        self.on_failure = on_failure
        self._tasks: dict[Key, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    async def wait(self, key: Key) -> None:
        """Before a pass of `key`: the previous pass's trailing writes are done. A pass that is
        cancelled here leaves them running."""
        task = self._tasks.get(key)
        if task is not None:
            await asyncio.wait([task])

    def start(self, key: Key, writes: Writes) -> None:
        """Run `writes` after the pass of `key` that made them (which waited for the ones
        before: the work queue runs one pass per key at a time)."""
        task = asyncio.get_running_loop().create_task(self._run(key, writes))
        self._tasks[key] = task
        task.add_done_callback(functools.partial(self._done, key))

    async def drain(self, timeout: float) -> int:
        """At shutdown: wait up to `timeout` seconds for every key's writes, then cancel what is
        left (the next leader stores a missing revision on its first pass). How many were
        cancelled."""
        tasks = list(self._tasks.values())
        if not tasks:
            return 0
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        return len(pending)

    async def _run(self, key: Key, writes: Writes) -> None:
        try:
            await writes
        except Exception as error:  # the pass is over: only its key can be retried
            self.on_failure(key, error)

    def _done(self, key: Key, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]


__all__ = ["Key", "Trailing", "Writes"]

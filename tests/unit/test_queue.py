"""The work queue: coalescing, requeue, backoff on failure and its reset on a new generation."""

from __future__ import annotations

import asyncio

import pytest

from dsv4_operator.runtime.queue import WorkQueue

# The loop's clock is virtual (looptime): sleeps and timers advance it instantly and exactly,
# so the counts below do not depend on how busy the machine is.
pytestmark = pytest.mark.looptime

KEY = ("ns", "x")


async def _run_for(queue: WorkQueue, seconds: float) -> None:
    task = asyncio.create_task(queue.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_burst_of_adds_coalesces() -> None:
    calls: list[tuple[str, str]] = []

    async def reconcile(key: tuple[str, str]) -> None:
        calls.append(key)
        await asyncio.sleep(0.05)

    queue = WorkQueue(reconcile, workers=2, resync_seconds=60)
    for _ in range(20):
        queue.add(KEY)
    await _run_for(queue, 0.3)
    assert calls == [KEY]


async def test_failures_back_off_and_new_generation_resets() -> None:
    times: list[float] = []

    async def failing(key: tuple[str, str]) -> None:
        times.append(asyncio.get_running_loop().time())
        raise RuntimeError("boom")

    queue = WorkQueue(failing, workers=1, resync_seconds=60, backoff_base=0.2)
    queue.add(KEY, generation=1)
    task = asyncio.create_task(queue.run())
    await asyncio.sleep(0.75)
    # t=0 fails, retry after 0.2, then after 0.4: three calls within 0.75 s, not a storm.
    assert len(times) == 3
    assert times[2] - times[1] > times[1] - times[0]
    queue.add(KEY, generation=1)  # same spec (a child event): the 0.8 s backoff stands
    await asyncio.sleep(0.05)
    assert len(times) == 3
    queue.add(KEY, generation=2)  # the spec changed: try at once
    await asyncio.sleep(0.05)
    calls_after_new_spec = len(times)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls_after_new_spec == 4


async def test_requeue_after_is_honoured() -> None:
    calls = 0

    async def waiting(key: tuple[str, str]) -> float:
        nonlocal calls
        calls += 1
        return 0.1

    queue = WorkQueue(waiting, workers=1, resync_seconds=60)
    queue.add(KEY)
    await _run_for(queue, 0.35)
    assert calls == 4  # t = 0, 0.1, 0.2, 0.3


async def test_forget_stops_retries() -> None:
    calls = 0

    async def failing(key: tuple[str, str]) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom")

    queue = WorkQueue(failing, workers=1, resync_seconds=0.1, backoff_base=0.1)
    queue.add(KEY)
    await asyncio.sleep(0)
    task = asyncio.create_task(queue.run())
    await asyncio.sleep(0.05)
    queue.forget(KEY)
    await asyncio.sleep(0.4)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1


async def test_a_key_whose_object_is_gone_is_not_resynced_unless_it_came_back() -> None:
    """The garbage collector deletes a deployment's children after it, and each deletion
    queues the owner's key again: a pass that finds no object must drop the key, or every
    deleted deployment is resynced for the operator's life."""
    calls: list[tuple[str, str]] = []
    came_back = ("ns", "y")
    queue: WorkQueue

    async def reconcile(key: tuple[str, str]) -> None:
        calls.append(key)
        if key == KEY or calls.count(key) == 1:
            if key == came_back:
                queue.add(key)  # created again while the pass that found nothing ran
            queue.gone(key)

    queue = WorkQueue(reconcile, workers=1, resync_seconds=10)
    queue.add(KEY)
    queue.add(came_back)
    await _run_for(queue, 35)
    # KEY: its one pass, no resync. The key created again: the pass that found nothing, the
    # one its event asked for (which found it), then a resync every 10 s as for any object.
    assert calls.count(KEY) == 1
    assert calls.count(came_back) == 2 + 3

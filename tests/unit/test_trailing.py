"""Writes a pass leaves behind: run after it, waited for by the key's next pass only; a failed
one reported with its key; what is left at shutdown drained, then cancelled."""

from __future__ import annotations

import asyncio

import pytest

from dsv4_operator.reconcile.trailing import Key, Trailing

# Virtual loop clock (looptime): the sleeps below take no real time and always order the same.
pytestmark = pytest.mark.looptime

A, B = ("ns", "a"), ("ns", "b")


def _unfailing() -> Trailing:
    def failed(key: Key, error: Exception) -> None:
        raise AssertionError(f"{key} failed: {error}")

    return Trailing(failed)


async def test_the_next_pass_of_a_key_waits_for_its_last_writes_and_other_keys_do_not() -> None:
    trailing = _unfailing()
    written: list[str] = []
    release = asyncio.Event()

    async def writes(what: str) -> None:
        await release.wait()
        written.append(what)

    trailing.start(A, writes("revision of a"))
    await trailing.wait(B)  # another key's pass starts at once
    assert written == [] and len(trailing) == 1
    waiting = asyncio.create_task(trailing.wait(A))
    await asyncio.sleep(1)
    assert not waiting.done()  # a's next pass is held until a's writes are done
    release.set()
    await waiting
    assert written == ["revision of a"]
    assert len(trailing) == 0  # done: nothing kept


async def test_a_pass_cancelled_while_waiting_leaves_the_writes_running() -> None:
    trailing = _unfailing()
    written: list[str] = []

    async def writes() -> None:
        await asyncio.sleep(2)
        written.append("event")

    trailing.start(A, writes())
    waiting = asyncio.create_task(trailing.wait(A))
    await asyncio.sleep(1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await trailing.wait(A)
    assert written == ["event"]


async def test_a_failed_write_is_reported_with_its_key_and_does_not_hold_the_next_pass() -> None:
    failures: list[tuple[Key, str]] = []
    trailing = Trailing(lambda key, error: failures.append((key, str(error))))

    async def refused() -> None:
        await asyncio.sleep(0.1)
        raise RuntimeError("controllerrevisions is forbidden")

    trailing.start(B, refused())
    await trailing.wait(B)
    assert failures == [(B, "controllerrevisions is forbidden")]
    assert len(trailing) == 0


async def test_shutdown_waits_for_what_finishes_in_time_and_cancels_the_rest() -> None:
    trailing = _unfailing()
    written: list[Key] = []
    cancelled: list[Key] = []

    async def writes(key: Key, seconds: float) -> None:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.append(key)
            raise
        written.append(key)

    trailing.start(A, writes(A, 1))
    trailing.start(B, writes(B, 60))
    assert await trailing.drain(timeout=5) == 1
    await asyncio.sleep(0)  # the cancellation reaches the task
    assert written == [A] and cancelled == [B]
    assert await trailing.drain(timeout=5) == 0

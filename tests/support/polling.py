"""Waiting in async tests on another process: its exit as an event (a pidfd), its progress
(counters in shared memory, which signal nothing) as a condition polled under a deadline;
never a fixed sleep. Synchronous tests use `dsv4_devcluster.wait_for`."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable


async def until(
    what: str, check: Callable[[], bool | Awaitable[bool]], timeout: float = 30
) -> None:
    """Return once `check()` (a function or a coroutine function) holds; fail naming `what`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        held = check()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def exited(what: str, pid: int, timeout: float = 30) -> None:
    """Return once process `pid` has ended (a zombie counts: it runs no more); fail naming
    `what` after `timeout` seconds. Any process, not only a child: Linux's pidfd becomes
    readable when it exits."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # already gone and reaped
    loop = asyncio.get_running_loop()
    ended = loop.create_future()

    def readable() -> None:  # the process has ended
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await asyncio.wait_for(ended, timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)

"""Waiting on another process's progress (a classifier, a server) in async unit tests: a
condition polled under a deadline, never a fixed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    """Return once `check()` holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)

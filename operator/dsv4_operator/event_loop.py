"""The event loop every long-running dsv4 process runs on: uvloop, with numeric addresses
resolved on the loop's own thread.

uvloop's `sock_connect` (which aiohttp's connections go through, via aiohappyeyeballs) asks
`getaddrinfo` for the address without a socket type, which uvloop's numeric fast path needs, so
even `10.0.3.7:9100` is looked up in libuv's thread pool (4 threads unless UV_THREADPOOL_SIZE
says otherwise). There, it waits behind every name lookup in flight: with slow or failing name
lookups queued (a canary run against a Service name the resolver answers slowly), every read of
a pod IP timed out at connect, the guard fell back to more runs by name, and the queue never
drained (docs/guard.md, "Connections to pod IPs"). Here a numeric host and port are answered
at once, as `socket.getaddrinfo` with AI_NUMERICHOST never touches the network; names still go
to uvloop's resolver.
"""

from __future__ import annotations

import socket
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

import uvloop

T = TypeVar("T")
# As uvloop's `getaddrinfo` gives them: family, type, protocol, canonical name, address.
AddrInfo = tuple[
    socket.AddressFamily, socket.SocketKind, int, str, tuple[str, int] | tuple[str, int, int, int]
]


def numeric_addrinfo(
    host: bytes | str | None, port: bytes | str | int | None, family: int, type_: int, proto: int,
    flags: int,
) -> list[AddrInfo] | None:  # fmt: skip
    """`getaddrinfo`'s answer when `host` is an IP address and `port` a number, else None."""
    if host is None:
        return None
    try:
        found = socket.getaddrinfo(
            host, port, family, type_, proto, flags | socket.AI_NUMERICHOST | socket.AI_NUMERICSERV
        )
        return cast(list[AddrInfo], found)
    except (socket.gaierror, UnicodeError):
        return None


class Loop(uvloop.Loop):
    """uvloop's loop, answering numeric `getaddrinfo` calls without its thread pool."""

    async def getaddrinfo(  # type: ignore[override]  # as uvloop's, which asyncio's stub is not
        self,
        host: bytes | str | None,
        port: bytes | str | int | None,
        *,
        family: int = 0,
        type: int = 0,  # asyncio's keyword name
        proto: int = 0,
        flags: int = 0,
    ) -> list[AddrInfo]:
        numeric = numeric_addrinfo(host, port, family, type, proto, flags)
        if numeric is not None:
            return numeric
        return await super().getaddrinfo(
            host, port, family=family, type=type, proto=proto, flags=flags
        )


def new_event_loop() -> Loop:
    return Loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`main` to completion on a new `Loop`."""
    result: T = uvloop.run(main, loop_factory=new_event_loop)
    return result

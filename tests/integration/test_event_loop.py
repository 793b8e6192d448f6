"""The operator's event loop: a connection to an IP address never waits on a name lookup.

uvloop's own resolver is replaced here by one that never answers, as libuv's thread pool is
when slow name lookups fill it: a connect to 127.0.0.1 on the plain uvloop loop waits on it
(the control), on ours (event_loop.py) it does not, nor does an aiohttp request; a name still
goes to uvloop's resolver."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import uvloop

from dsv4_operator.event_loop import run

pytestmark = pytest.mark.integration
STUCK_FOR = 5.0  # seconds: a bound on failure only; a passing connect takes microseconds


@pytest.fixture
def stuck_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, Any]]]:
    """uvloop's resolver never answers; what it was asked is recorded."""
    asked: list[tuple[Any, Any]] = []

    async def never(self: Any, host: Any, port: Any, **kwargs: Any) -> Any:
        asked.append((host, port))
        await asyncio.sleep(3600)

    monkeypatch.setattr(uvloop.Loop, "getaddrinfo", never)
    yield asked


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


async def _connect(port: int, within: float = STUCK_FOR) -> None:
    loop = asyncio.get_running_loop()
    with socket.socket() as sock:
        sock.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), within)


def test_a_connect_to_an_ip_waits_on_uvloops_resolver_on_the_plain_loop(
    stuck_resolver: list[tuple[Any, Any]], listener: int
) -> None:
    # The control: what the operator's loop is there to avoid.
    with pytest.raises(TimeoutError):
        uvloop.run(_connect(listener, within=0.5))  # it never connects: any bound shows it
    assert stuck_resolver == [("127.0.0.1", listener)]


def test_a_connect_to_an_ip_does_not_wait_on_the_resolver_on_ours(
    stuck_resolver: list[tuple[Any, Any]], listener: int
) -> None:
    run(_connect(listener))
    assert stuck_resolver == []


def test_an_aiohttp_request_to_an_ip_does_not_wait_on_the_resolver(
    stuck_resolver: list[tuple[Any, Any]],
) -> None:
    async def main() -> int:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        timeout = aiohttp.ClientTimeout(total=STUCK_FOR)
        async with (
            server,
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/", timeout=timeout) as reply,
        ):
            await reply.read()
            return reply.status

    assert run(main()) == 200
    assert stuck_resolver == []


def test_a_name_still_goes_to_uvloops_resolver(stuck_resolver: list[tuple[Any, Any]]) -> None:
    async def lookup() -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(loop.getaddrinfo("localhost", 80), 0.2)

    run(lookup())
    assert stuck_resolver == [("localhost", 80)]

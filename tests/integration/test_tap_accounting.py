"""The tap accounts for every response through `dsv4 tap`: a streamed answer that ends when the
router closes the connection (no Content-Length, not chunked: HTTP/1.0, or HTTP/1.1 with
`Connection: close`) is classified at the end of its stream, like any other."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from .tap_support import TOOLS, TapProcess, running_tap, stream_of

pytestmark = pytest.mark.asyncio

HEADS = {
    "http/1.0": b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n",
    "connection-close": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    ),
}


async def _close_delimited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A router that answers one streamed request per connection, then closes it: the close is
    the only end of the response. The request's `user` names the head (`HEADS`)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:  # a connection that asked nothing (readiness)
        writer.close()
        return
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    body = json.loads(await reader.readexactly(length))
    writer.write(HEADS[body["user"]])
    for chunk in stream_of(leak=body["model"] == "leaky"):
        writer.write(chunk)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


@pytest.fixture
async def tap() -> AsyncIterator[TapProcess]:
    server = await asyncio.start_server(_close_delimited, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    try:
        async with running_tap(f"http://{host}:{port}") as tap:
            yield tap
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("style", sorted(HEADS))
async def test_a_stream_that_ends_when_the_router_closes_is_classified(
    tap: TapProcess, style: str
) -> None:
    count = 6
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            body: dict[str, Any] = {
                "model": "leaky" if i % 2 else "m",
                "stream": True,
                "user": style,
                "messages": [{"role": "user", "content": "weather?"}],
                "tools": TOOLS,
            }
            async with session.post(f"{tap.url}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                assert "Content-Length" not in response.headers
                assert "Transfer-Encoding" not in response.headers
                assert (await response.read()).endswith(b"data: [DONE]\n\n")
    assert await tap.value("dsv4_traffic_requests_total", tool_calling="true") == count
    await tap.settled("dsv4_traffic_responses_total", count // 2, verdict="leaked_markup")
    await tap.settled("dsv4_traffic_responses_total", count // 2, verdict="ok")
    assert await tap.value("dsv4_traffic_responses_total") == count
    assert await tap.value("dsv4_tap_unobserved_connections_total") == 0

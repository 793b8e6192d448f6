"""The guard's HTTP clients (signals/http.py, aiohttp_transport.py) against small
servers on 127.0.0.1: what a request brings back, and which httpx error says when it failed
(the canary retries only the ones raised before the request was sent), for the spec URLs'
client and the pods' pages alike."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from dsv4_operator.aiohttp_transport import environment_proxies
from dsv4_operator.signals.http import GuardHttp, HttpxPages
from tests.support.proxies import PROXY_VARIABLES, clear_proxies

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> AsyncIterator[str]:
    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(guarded, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/metrics"


class Answering:
    """Answers every request on a connection (gzip body: the request line and its X-Probe
    header) until the client closes it; counts the connections."""

    def __init__(self) -> None:
        self.connections = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed the connection
                return
            lines = head.split(b"\r\n")
            probe = [line for line in lines if line.lower().startswith(b"x-probe:")]
            body = gzip.compress(b"\n".join([lines[0], *probe]))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nX-Kind: metrics\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()


async def _close_after_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")


async def _half_a_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly this")
    await writer.drain()


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    await asyncio.sleep(30)


Read = Callable[[str, float], Awaitable[str]]


@pytest.fixture(params=["spec_urls", "pods"])
async def read(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Read]:
    """One page's text, as the scrapes read it: through the spec URLs' httpx client, or the
    pods' pages (aiohttp directly)."""
    clear_proxies(monkeypatch)  # with a proxy named, spec_urls would be httpx's own transport
    http = GuardHttp.create()
    yield HttpxPages(http.spec_urls).text if request.param == "spec_urls" else http.pods.text
    await http.close()


async def test_a_reply_comes_back_with_its_headers_and_decoded_body() -> None:
    http = GuardHttp.create()
    answering = Answering()
    try:
        async for url in _serve(answering):
            for _ in range(2):
                reply = await http.spec_urls.get(url, headers={"X-Probe": "1"})
                assert reply.status_code == 200 and reply.headers["x-kind"] == "metrics"
                assert reply.text.lower() == "get /metrics http/1.1\nx-probe: 1"
    finally:
        await http.close()
    assert answering.connections == 1  # spec URLs keep the connection for the next request


async def test_a_page_comes_back_decoded(read: Read, request: pytest.FixtureRequest) -> None:
    answering = Answering()
    async for url in _serve(answering):
        for _ in range(2):
            assert (await read(url, 5.0)).lower() == "get /metrics http/1.1"
    # spec URLs keep the connection for the next request; pod reads open one each.
    kept = request.node.callspec.params["read"] == "spec_urls"
    assert answering.connections == (1 if kept else 2)


def _answers(status: bytes) -> Handler:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 %s\r\nLocation: /elsewhere\r\nContent-Length: 4\r\n\r\nbusy" % status
        )
        await writer.drain()

    return answer


@pytest.mark.parametrize("status", [b"503 Service Unavailable", b"302 Found"])
async def test_a_status_other_than_2xx_is_an_http_status_error(read: Read, status: bytes) -> None:
    async for url in _serve(_answers(status)):
        with pytest.raises(httpx.HTTPStatusError) as raised:
            await read(url, 5.0)
        assert raised.value.response.status_code == int(status.split()[0])


async def test_a_refused_connection_is_a_connect_error(read: Read) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(httpx.ConnectError):
        await read(f"http://127.0.0.1:{port}/metrics", 5.0)


@pytest.mark.parametrize(
    ("handler", "error"),
    [
        (_close_after_request, httpx.RemoteProtocolError),
        (_half_a_body, httpx.ReadError),
        (_silent, httpx.ReadTimeout),
    ],
)
async def test_a_failure_after_the_request_went_out_is_not_a_connect_error(
    read: Read, handler: Handler, error: type[httpx.HTTPError]
) -> None:
    async for url in _serve(handler):
        with pytest.raises(error) as raised:
            await read(url, 0.5)
        assert not isinstance(raised.value, (httpx.ConnectError, httpx.ConnectTimeout))


async def test_pod_pages_never_go_through_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as free:  # a proxy that refuses: a read through it would fail
        free.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{free.getsockname()[1]}"
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    http = GuardHttp.create()
    try:
        async for url in _serve(Answering()):
            assert (await http.pods.text(url, 5.0)).lower() == "get /metrics http/1.1"
    finally:
        await http.close()


def test_the_proxies_are_the_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_proxies(monkeypatch)
    monkeypatch.setenv("NO_PROXY", "example.com")
    assert environment_proxies() == {}
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert environment_proxies() == {"https": "http://proxy:3128"}

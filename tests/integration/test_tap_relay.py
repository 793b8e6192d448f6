"""The tap's relay on uvloop (the loop `dsv4 tap` runs), spoken to over raw HTTP/1.1: bytes
pass unchanged in both directions (pipelined requests, a HEAD), a side that does not read
pauses the other instead of filling the tap's memory, a request body too large to classify
is still forwarded, and a router that is not there gets a 502 per request. The router's
stand-in is a local aiohttp app."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop
from aiohttp import web

from dsv4_operator.leak.verdict import VerdictKind
from dsv4_operator.tap.proxy import Tap, TapConfig
from dsv4_operator.tap.relay import ClientConnection
from tests.support.polling import until

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
LEAK = "<｜DSML｜tool_calls>"
# More than the socket buffers on the way can hold (a few MiB each: a receive buffer grows only
# as its reader reads), so without flow control most of it would wait in the tap's memory.
BIG = bytes(range(256)) * (1 << 17)  # 32 MiB
# What the tap may hold for one direction while the other side does not read: the transport's
# high-water mark plus one read.
TAP_BUFFER_BOUND = 1 << 20
RELEASE = web.AppKey("release", asyncio.Event)


async def _chat(request: web.Request) -> web.Response:
    body = await request.json()
    message = {"role": "assistant", "content": LEAK if body.get("model") == "leaky" else "hi"}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return web.json_response({"object": "chat.completion", "choices": [choice]})


async def _big(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    response.content_length = len(BIG)
    await response.prepare(request)
    for at in range(0, len(BIG), 1 << 16):
        await response.write(BIG[at : at + (1 << 16)])
    await response.write_eof()
    return response


async def _sink(request: web.Request) -> web.Response:
    """Reads the body only once released (until then the server stops reading the socket)."""
    await request.app[RELEASE].wait()
    return web.Response(text=hashlib.sha256(await request.read()).hexdigest())


async def _release(request: web.Request) -> web.Response:
    request.app[RELEASE].set()
    return web.Response(text="released")


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok", headers={"X-Length-Was": str(request.content_length)})


def _post(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )


async def _exchange(address: tuple[str, int], data: bytes, responses: int) -> bytes:
    """Send `data` on one connection, read until `responses` have arrived (or it closes)."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(data)
    await writer.drain()
    received = b""
    while received.count(b"HTTP/1.1 ") < responses or not _complete(received):
        chunk = await asyncio.wait_for(reader.read(65536), 30)
        if not chunk:
            break
        received += chunk
    writer.close()
    return received


def _complete(received: bytes) -> bool:
    """Whether the last response in `received` has all of its Content-Length."""
    head, separator, body = received[received.rfind(b"HTTP/1.1 ") :].partition(b"\r\n\r\n")
    lengths = [line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")]
    return bool(separator) and len(body) >= (int(lengths[0].split(b":")[1]) if lengths else 0)


def _with_stack(
    scenario: Callable[[Tap, tuple[str, int], tuple[str, int]], Awaitable[None]],
    capture_limit: int = 4 << 20,
) -> None:
    async def main() -> None:
        app = web.Application(client_max_size=2 * len(BIG))
        app[RELEASE] = asyncio.Event()
        app.router.add_post("/v1/chat/completions", _chat)
        app.router.add_route("*", "/health", _health)
        app.router.add_get("/big", _big)
        app.router.add_post("/sink", _sink)
        app.router.add_post("/release", _release)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        router = runner.addresses[0][:2]
        config = TapConfig(f"http://{router[0]}:{router[1]}", "d", capture_limit=capture_limit)
        tap = Tap(config, supervise_seconds=3600)
        await tap.start()
        try:
            await scenario(tap, await tap.listen("127.0.0.1", 0), router)
        finally:
            await tap.close()
            await runner.cleanup()

    uvloop.run(main())


def _submissions(tap: Tap) -> list[bytes]:
    """The request bodies the relay hands to the classifier from now on, in order. It hands
    them over in the same callback that wrote the response's last bytes to the client, so
    once a client has read a response, its submission (or none) is already recorded."""
    submitted: list[bytes] = []
    submit = tap.relay.hooks.exchange

    def recording(request: bytes, response: bytes) -> bool:
        submitted.append(request)
        return submit(request, response)

    tap.relay.hooks.exchange = recording
    return submitted


UNOBSERVED = "dsv4_tap_unobserved_connections_total"


def _metric(tap: Tap, name: str, **labels: str) -> float | None:
    """A sample of the tap's /metrics registry (namespace "default", deployment "d")."""
    return tap.metrics.registry.get_sample_value(
        name, {"namespace": "default", "deployment": "d", **labels}
    )


def _without_dates(received: bytes) -> bytes:
    return b"\r\n".join(line for line in received.split(b"\r\n") if not line.startswith(b"Date:"))


def test_pipelined_requests_pass_unchanged_and_each_is_classified() -> None:
    async def scenario(tap: Tap, address: tuple[str, int], router: tuple[str, int]) -> None:
        submitted = _submissions(tap)
        pipelined = (
            _post({"model": "leaky", "messages": [], "tools": TOOLS})
            + b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
            + _post({"model": "m", "messages": [], "tools": TOOLS})
            + _post({"model": "leaky", "messages": []})  # no tools: not classified
        )
        direct = await _exchange(router, pipelined, 4)
        relayed = await _exchange(address, pipelined, 4)
        assert _without_dates(relayed) == _without_dates(direct)
        assert relayed.count(b"HTTP/1.1 200 OK") == 4
        assert [b'"leaky"' in body for body in submitted] == [True, False]  # the tool-calling two
        await until("two verdicts", lambda: tap.link.counts().lag_buckets[-1] >= 2)
        verdicts = tap.link.counts().verdicts
        assert verdicts[VerdictKind.LEAKED_MARKUP] == 1 and verdicts[VerdictKind.OK] == 1
        assert _metric(tap, "dsv4_traffic_requests_total", tool_calling="true") == 2
        assert _metric(tap, "dsv4_traffic_requests_total", tool_calling="false") == 2

    _with_stack(scenario)


async def _relayed_connection(tap: Tap) -> ClientConnection:
    """The tap's one client connection, once its router connection is there."""
    await until(
        "the tap to connect to the router",
        lambda: any(connection.router is not None for connection in tap.relay.connections),
    )
    (connection,) = tap.relay.connections
    return connection


def test_a_client_that_does_not_read_pauses_the_router_instead_of_filling_the_tap() -> None:
    async def scenario(tap: Tap, address: tuple[str, int], router: tuple[str, int]) -> None:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
        await writer.drain()  # and read nothing yet
        connection = await _relayed_connection(tap)
        assert connection.router is not None
        upstream = connection.router
        await until("the tap to stop reading the router", lambda: not upstream.is_reading())
        assert connection.transport.get_write_buffer_size() <= TAP_BUFFER_BOUND
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert await asyncio.wait_for(reader.readexactly(len(BIG)), 60) == BIG
        writer.close()

    _with_stack(scenario)


def test_a_router_that_does_not_read_pauses_the_client_instead_of_filling_the_tap() -> None:
    async def scenario(tap: Tap, address: tuple[str, int], router: tuple[str, int]) -> None:
        reader, writer = await asyncio.open_connection(*address)
        head = f"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: {len(BIG)}\r\n\r\n"
        writer.write(head.encode() + BIG)
        sending = asyncio.ensure_future(writer.drain())
        connection = await _relayed_connection(tap)
        await until(
            "the tap to stop reading the client", lambda: not connection.transport.is_reading()
        )
        assert connection.router is not None
        assert connection.router.get_write_buffer_size() <= TAP_BUFFER_BOUND
        release = b"POST /release HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"
        assert b"released" in await _exchange(router, release, 1)
        await asyncio.wait_for(sending, 60)
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        digest = hashlib.sha256(BIG).hexdigest().encode()
        assert await asyncio.wait_for(reader.readexactly(len(digest)), 60) == digest
        writer.close()

    _with_stack(scenario)


def test_after_a_head_request_the_connection_is_relayed_unread() -> None:
    async def scenario(tap: Tap, address: tuple[str, int], router: tuple[str, int]) -> None:
        submitted = _submissions(tap)
        data = b"HEAD /health HTTP/1.1\r\nHost: t\r\n\r\n" + _post(
            {"model": "leaky", "messages": [], "tools": TOOLS}
        )
        relayed = await _exchange(address, data, 2)
        assert _without_dates(relayed) == _without_dates(await _exchange(router, data, 2))
        assert b"DSML" in relayed  # the leak went through, unread
        assert _metric(tap, UNOBSERVED, reason="head") == 1
        assert submitted == []  # not classified: after a HEAD the framing is unknown

    _with_stack(scenario)


def test_a_request_too_large_to_classify_is_forwarded_and_counted() -> None:
    async def scenario(tap: Tap, address: tuple[str, int], router: tuple[str, int]) -> None:
        submitted = _submissions(tap)
        padding = "x" * 4096
        data = _post(
            {"model": "leaky", "messages": [{"role": "user", "content": padding}], "tools": TOOLS}
        )
        relayed = await _exchange(address, data, 1)
        assert relayed.startswith(b"HTTP/1.1 200 OK") and b"DSML" in relayed
        # Still counted as tool-calling, but too large to hand over.
        assert _metric(tap, "dsv4_traffic_requests_total", tool_calling="true") == 1
        assert _metric(tap, "dsv4_tap_capture_skipped_total") == 1
        assert submitted == []

    _with_stack(scenario, capture_limit=1024)


def test_a_fault_in_reading_never_reaches_the_traffic() -> None:
    async def scenario(tap: Tap, address: tuple[str, int], router: tuple[str, int]) -> None:
        def broken(request: bytes, response: bytes) -> bool:
            raise RuntimeError("a bug in the classifier link")

        tap.relay.hooks.exchange = broken
        data = _post({"model": "leaky", "messages": [], "tools": TOOLS}) * 2
        relayed = await _exchange(address, data, 2)
        assert relayed.count(b"HTTP/1.1 200 OK") == 2  # both answered, on the same connection
        assert _metric(tap, UNOBSERVED, reason="unparsable") == 1

    _with_stack(scenario)


def test_a_router_that_is_not_there_gets_a_502_per_request() -> None:
    async def main() -> None:
        tap = Tap(TapConfig("http://127.0.0.1:9", "d"), supervise_seconds=3600)  # discard port
        await tap.start()
        try:
            address = await tap.listen("127.0.0.1", 0)
            for _ in range(2):
                answer = await _exchange(address, _post({"model": "m", "messages": []}), 1)
                assert answer.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
                assert b"dsv4 tap: router unreachable" in answer
            assert _metric(tap, "dsv4_tap_upstream_errors_total") == 2
        finally:
            await tap.close()

    uvloop.run(main())


def test_an_upstream_that_is_not_plain_http_is_refused_with_the_field_named() -> None:
    for upstream in ("https://router:8000", "router:8000", "http://router:8000/v1"):
        try:
            TapConfig(upstream, "d").router_address()
        except ValueError as exc:
            assert upstream in str(exc) and "http://host:port" in str(exc)
        else:
            raise AssertionError(f"{upstream} accepted")
    assert TapConfig("http://[::1]:8000", "d").router_address() == ("::1", 8000)

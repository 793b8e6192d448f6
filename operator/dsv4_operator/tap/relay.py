"""The tap's data path: one router connection per client connection, every byte passed on the
moment it arrives, in both directions, unchanged (asyncio protocols, no HTTP framing redone).
A `ConnectionObserver` reads the same bytes after they are sent, for the classifier.

Why a relay and not an HTTP proxy: re-framing each streamed chunk (parse, wake a task, frame
again) cost the aiohttp proxy about 65 us of CPU per chunk, the relay about 30 us, most of it
the read and write system calls (bench/tap.py, 64 and 256 streams). Flow control is end to
end: a side that cannot keep up pauses reading from the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
from collections.abc import Callable
from time import perf_counter
from typing import NamedTuple, cast

import httptools

from dsv4_operator.tap.observe import ConnectionObserver, Hooks


class Sockets(NamedTuple):
    """A relayed connection's two socket descriptors, as `FirstBytes` holds them."""

    client: int
    router: int


class _Router(asyncio.Protocol):
    """The tap's connection to the router: what arrives goes to the client, then is read.

    `data_received` runs once per streamed chunk: what it calls is looked up once, here."""

    __slots__ = ("_feed", "_first_bytes", "_timed", "_write", "client")

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        self._write = client.transport.write
        self._timed = client.relay.chunk_written
        self._feed = client.observer.feed_response
        self._first_bytes = client.relay.first_bytes

    def data_received(self, data: bytes) -> None:
        began = perf_counter()
        self._write(data)
        self._timed(perf_counter() - began)
        if self.client.awaiting_head:  # the response has begun: the loop's from now on
            self._first_bytes.head_came(self.client)
        self._feed(data)
        self._first_bytes.tick()

    def eof_received(self) -> bool:
        return False  # the router closed: close the client's connection once it has it all

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()  # after what is buffered has been written
        self.client.observer.router_closed()  # the end of a close-delimited response

    def pause_writing(self) -> None:  # the router reads slower than the client sends
        self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        self.client.transport.resume_reading()


class ClientConnection(asyncio.Protocol):
    """A client's connection to the tap, relayed to its own connection to the router."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.observer = ConnectionObserver(relay.hooks)
        self.transport: asyncio.Transport
        self.router: asyncio.Transport | None = None  # once connected
        self._connecting: asyncio.Task[None] | None = None
        self._refused: _Refusal | None = None
        self._early: list[bytes] = []  # what arrived before the router's connection
        self.awaiting_head = False  # a request went to the router, nothing has come back yet
        self.watched: Sockets | None = None  # while the relay's FirstBytes holds them

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport = cast(asyncio.Transport, transport)
        # Until the router's connection is there (uvloop may still deliver a first read).
        transport.pause_reading()
        self.relay.connections.add(self)
        self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            router, _ = await loop.create_connection(
                lambda: _Router(self), self.relay.host, self.relay.port
            )
        except OSError as exc:
            # Answer 502 (the router is down, not the client's fault); the client may retry.
            self._refused = _Refusal(self, f"dsv4 tap: router unreachable: {exc}\n")
        else:
            self.router = router
            self.relay.first_bytes.watch(self)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.router is not None:
            began = perf_counter()
            self.router.write(data)
            self.relay.request_forwarded(perf_counter() - began)
            if not self.awaiting_head:
                self.relay.first_bytes.await_head(self)
            self.observer.feed_request(data)
        elif self._refused is not None:
            self._refused.feed(data)
        else:
            self._early.append(data)

    def eof_received(self) -> bool:
        if self.router is not None and self.router.can_write_eof():
            self.router.write_eof()  # half-close: the response may still come
            return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.connections.discard(self)
        self.relay.first_bytes.forget(self)
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        if self.router is not None:
            self.router.close()

    def pause_writing(self) -> None:  # the client reads slower than the router sends
        if self.router is not None:
            self.router.pause_reading()

    def resume_writing(self) -> None:
        if self.router is not None:
            self.router.resume_reading()


class _Refusal:
    """Reads the client's first request, answers it 502 (`Connection: close`) and closes."""

    def __init__(self, client: ClientConnection, text: str) -> None:
        self.client = client
        self.body = text.encode()
        self.parser = httptools.HttpRequestParser(self)

    def feed(self, data: bytes) -> None:
        if not self.client.transport.is_closing():
            with contextlib.suppress(httptools.HttpParserError):
                self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        if self.client.transport.is_closing():
            return
        self.client.relay.upstream_error()
        head = (
            "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n"
        )
        self.client.transport.write(head.encode() + self.body)
        self.client.transport.close()


class FirstBytes:
    """Serves a session's first bytes (a client's new request, the router's response head) ahead
    of the streaming chunks the loop is working through.

    libuv registers sockets level-triggered: a socket the loop has just read is queued again
    at once, so a request or a head that arrives while the loop works through a burst of chunks
    waits behind every streaming socket's next chunk (bench/results/tap-vs-haproxy.md). Here
    every client socket, and a router socket while its response has not begun, are also in an
    edge-triggered epoll (arrival order) that the relay polls, without waiting, every `every`
    chunks; a socket that has data is read at once (its transport would read the same bytes
    later, in the same order; it finds nothing, or what came since). A streaming router socket
    is not in it: every chunk it took cost the kernel a second wake-up entry and the poll a
    Python step (bench/tap.py, decode-step bursts: CPU per chunk 1.33-1.69x HAProxy's with
    every socket in it, 1.29-1.48x with these alone; bench/results/tap-vs-haproxy.md)."""

    def __init__(self, every: int = 16) -> None:
        self.every = every
        self._poll = select.epoll()
        self._sockets: dict[int, tuple[ClientConnection, bool]] = {}  # fd -> (conn, is client)
        self._chunks = 0
        self._serving = False

    def watch(self, client: ClientConnection) -> None:
        """A connection to serve: its client socket from now on, its router socket once it
        awaits a head (`await_head`)."""
        assert client.router is not None
        sockets = Sockets(
            client.transport.get_extra_info("socket").fileno(),
            client.router.get_extra_info("socket").fileno(),
        )
        self._register(sockets.client)
        self._sockets[sockets.client] = (client, True)
        self._sockets[sockets.router] = (client, False)
        client.watched = sockets

    def await_head(self, client: ClientConnection) -> None:
        """A request went to the router: serve its socket until the response begins (a head
        already there is reported too: epoll checks a socket as it is added)."""
        client.awaiting_head = True
        # A router connection that is closing has no head to come, and its number may soon be
        # another's.
        if (
            client.watched is not None
            and client.router is not None
            and not client.router.is_closing()
        ):
            self._register(client.watched.router)

    def head_came(self, client: ClientConnection) -> None:
        """The response has begun: its chunks are the loop's."""
        client.awaiting_head = False
        if client.watched is not None:
            self._unregister(client.watched.router)

    def _register(self, fd: int) -> None:
        with contextlib.suppress(OSError, ValueError):  # closed meanwhile: its transport knows
            self._poll.register(fd, select.EPOLLIN | select.EPOLLET)

    def _unregister(self, fd: int) -> None:
        with contextlib.suppress(OSError, ValueError):  # not in it, or closed
            self._poll.unregister(fd)

    def forget(self, client: ClientConnection) -> None:
        """The connection has closed: its sockets are no longer served (a closed socket left
        the epoll with its close; its number may be another connection's by now)."""
        for fd in client.watched or ():
            if self._sockets.get(fd, (None, False))[0] is client:
                del self._sockets[fd]
                self._unregister(fd)
        client.watched = None

    def tick(self) -> None:
        self._chunks += 1
        if self._chunks >= self.every and not self._serving:
            self._chunks = 0
            self.serve()

    def serve(self) -> None:
        """Read what is first in a session and ready now (never waits)."""
        self._serving = True
        try:
            for fd, _ in self._poll.poll(0):
                client, is_client = self._sockets.get(fd, (None, False))
                if client is None or client.router is None:
                    continue
                transport = client.transport if is_client else client.router
                if transport.is_closing() or not transport.is_reading():
                    continue  # flow control holds it, or it is going: its transport decides
                if not is_client and not client.awaiting_head:
                    continue  # a streaming response: in the loop's order
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:  # nothing after all, or an error its transport will report
                    continue
                if not data:
                    continue  # the end: its transport sees it too
                if is_client:
                    client.data_received(data)
                else:
                    cast(_Router, client.router.get_protocol()).data_received(data)
        finally:
            self._serving = False

    def fileno(self) -> int:
        """The epoll's descriptor (what it holds: /proc/self/fdinfo/<fd>, `tfd` lines)."""
        return self._poll.fileno()

    def close(self) -> None:
        self._poll.close()


class Relay:
    """The listening side: where the router is, what to report, the open connections."""

    def __init__(
        self,
        host: str,
        port: int,
        hooks: Hooks,
        request_forwarded: Callable[[float], None],
        chunk_written: Callable[[float], None],
        upstream_error: Callable[[], None],
    ) -> None:
        self.host, self.port = host, port
        self.hooks = hooks
        self.request_forwarded = request_forwarded
        self.chunk_written = chunk_written
        self.upstream_error = upstream_error
        self.connections: set[ClientConnection] = set()
        self.first_bytes = FirstBytes()
        self._server: asyncio.Server | None = None

    async def listen(self, host: str, port: int, reuse_port: bool = False) -> tuple[str, int]:
        """Start accepting; the address bound (port 0 picks one). `reuse_port`: other relays
        may listen on the same address, and the kernel spreads connections over them."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(self), host, port, reuse_port=reuse_port
        )
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for connection in list(self.connections):
                connection.transport.close()
            await self._server.wait_closed()
        self.first_bytes.close()

"""A session's first bytes go ahead of the chunks the tap's loop is working through
(tap/relay.py `FirstBytes`): a client's new request and the router's response head are read
and passed on by the relay's own poll, without waiting for the loop's turn; a streaming
chunk, and a socket that flow control holds, are left to the loop. Real sockets on uvloop;
the loop does not run between the bytes' arrival and the poll, so what arrives on the other
side came through the poll."""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import AsyncIterator

import uvloop

from dsv4_operator.tap.observe import Hooks
from dsv4_operator.tap.relay import ClientConnection, Relay
from tests.support.polling import until

REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNK = b"d\r\ndata: hello\n\n\r\n"


def _relay(router: tuple[str, int]) -> Relay:
    hooks = Hooks(
        request=lambda tools: None,
        exchange=lambda request, response: True,
        too_large=lambda: None,
        unobserved=lambda reason: None,
        capture_limit=1 << 20,
    )
    return Relay(
        *router,
        hooks,
        request_forwarded=lambda seconds: None,
        chunk_written=lambda seconds: None,
        upstream_error=lambda: None,
    )


@contextlib.asynccontextmanager
async def _session() -> AsyncIterator[tuple[Relay, ClientConnection, socket.socket, socket.socket]]:
    """A relay to a plain listening socket, one client connected through it: (the relay, its
    connection, the client's socket, the router's side of the tap's connection)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        relay = _relay(listener.getsockname()[:2])
        client = socket.create_connection(await relay.listen("127.0.0.1", 0))
        connections: list[ClientConnection] = []

        def connected() -> bool:
            connections[:] = [c for c in relay.connections if c.router is not None]
            return bool(connections)

        await until("the tap's connection to the router", connected)
        router_side, _ = listener.accept()
        with client, router_side:
            yield relay, connections[0], client, router_side
        await relay.close()


def _readable(transport_socket_fd: int) -> None:
    """Wait (blocking: the loop must not run) until the tap's socket has the bytes sent."""
    ready, _, _ = select.select([transport_socket_fd], [], [], 10)
    assert ready, "the bytes never reached the tap's socket"


def _received(sock: socket.socket) -> bytes:
    """What `sock` has now, without waiting (b"" for nothing)."""
    try:
        return sock.recv(1 << 16, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b""


async def _arrives(sock: socket.socket, expected: bytes, what: str) -> None:
    """Until `sock` has received exactly `expected`, read as it comes (the loop relays it)."""
    received = bytearray()

    def arrived() -> bool:
        received.extend(_received(sock))
        return bytes(received) == expected

    await until(what, arrived)


def test_a_request_and_its_head_pass_without_the_loop_and_a_chunk_waits_for_it() -> None:
    async def main() -> None:
        async with _session() as (relay, connection, client, router_side):
            assert connection.router is not None
            client.sendall(REQUEST)
            _readable(connection.transport.get_extra_info("socket").fileno())
            relay.first_bytes.serve()  # the loop does not run meanwhile
            assert _received(router_side) == REQUEST

            router_side.sendall(HEAD)
            _readable(connection.router.get_extra_info("socket").fileno())
            relay.first_bytes.serve()
            assert _received(client) == HEAD

            # The response has begun: its chunks are the loop's, in its order.
            router_side.sendall(CHUNK)
            _readable(connection.router.get_extra_info("socket").fileno())
            relay.first_bytes.serve()
            assert _received(client) == b""
            await _arrives(client, CHUNK, "the chunk, relayed by the loop")

    uvloop.run(main())


def test_a_client_that_flow_control_holds_is_not_read_by_the_poll() -> None:
    async def main() -> None:
        async with _session() as (relay, connection, client, router_side):
            await until("the client's transport reading", connection.transport.is_reading)
            connection.transport.pause_reading()  # as when the router does not read
            client.sendall(REQUEST)
            _readable(connection.transport.get_extra_info("socket").fileno())
            relay.first_bytes.serve()
            assert _received(router_side) == b""
            connection.transport.resume_reading()
            await _arrives(router_side, REQUEST, "the request, once the client is read again")

    uvloop.run(main())


def _polled(relay: Relay) -> set[int]:
    """The sockets in the relay's first-bytes epoll, as the kernel lists them."""
    with open(f"/proc/self/fdinfo/{relay.first_bytes.fileno()}") as info:
        return {int(line.split()[1]) for line in info if line.startswith("tfd:")}


def test_a_router_socket_is_polled_only_while_its_response_has_not_begun() -> None:
    async def main() -> None:
        async with _session() as (relay, connection, client, router_side):
            assert connection.router is not None
            client_fd = connection.transport.get_extra_info("socket").fileno()
            router_fd = connection.router.get_extra_info("socket").fileno()
            assert _polled(relay) == {client_fd}
            client.sendall(REQUEST)
            await _arrives(router_side, REQUEST, "the request")
            assert _polled(relay) == {client_fd, router_fd}  # its head is awaited
            router_side.sendall(HEAD + CHUNK)
            await _arrives(client, HEAD + CHUNK, "the head and a chunk")
            assert _polled(relay) == {client_fd}  # streaming: the loop's alone
            client.sendall(REQUEST)  # the next request on the kept connection
            await _arrives(router_side, REQUEST, "the next request")
            assert _polled(relay) == {client_fd, router_fd}
            client.close()
            router_side.close()
            await until("the connection closed", lambda: not relay.connections)
            assert _polled(relay) == set()

    uvloop.run(main())

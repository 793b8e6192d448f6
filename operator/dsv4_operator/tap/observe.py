"""Reads the HTTP/1.1 exchanges of one relayed connection (httptools), never altering them:
which requests offered tools, and a copy of their responses for the classifier.

A response with neither a length nor chunks ends when the router closes the connection (HTTP/1.0,
or `Connection: close`): the parser cannot see that end, so the relay reports the close
(`ConnectionObserver.router_closed`) and the response is handed over as the client got it.

The relay forwards every byte whatever happens here: a connection this module cannot follow
(a HEAD request, whose response length the parser cannot know; an upgrade; bytes that are not
HTTP/1.1) is left unobserved from then on, and counted.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import httptools

from dsv4_operator.names import PROBE_HEADER
from dsv4_operator.tap.classify import TOOLS_MARKER

_PROBE = next(iter(PROBE_HEADER)).lower().encode()
log = logging.getLogger(__name__)


class Unobserved(StrEnum):
    """Why the tap stopped reading a connection (it still forwards it)."""

    HEAD = "head"
    UPGRADE = "upgrade"
    UNPARSABLE = "unparsable"


class Exchange:
    """One request and its response on a connection; bodies kept up to the capture limit."""

    __slots__ = (
        "ended", "keeping", "marker", "method", "overflow", "probe", "request", "response",
        "size", "tail",
    )  # fmt: skip

    def __init__(self) -> None:
        self.method = b""
        self.ended = False  # the request has ended (the client may still be sending it)
        self.probe = False
        self.marker = False  # TOOLS_MARKER seen in the request body
        self.tail = b""  # the request body's last bytes: a marker split between two parts
        self.request: list[bytes] = []
        self.response: list[bytes] = []
        self.size = 0
        self.overflow = False
        # Bodies are kept while the exchange may be a tool-calling one within the limit.
        self.keeping = True

    def request_part(self, part: bytes, limit: int) -> None:
        joined = self.tail + part
        self.marker = self.marker or TOOLS_MARKER in joined
        self.tail = joined[1 - len(TOOLS_MARKER) :]
        self._keep(part, self.request, limit)

    def _keep(self, part: bytes, into: list[bytes], limit: int) -> None:
        if not self.keeping:
            return
        self.size += len(part)
        if self.size > limit:  # too large to classify: still forwarded, counted
            self.overflow = True
            self.let_go()
        else:
            into.append(part)

    def let_go(self) -> None:
        """Keep nothing more of this exchange's bodies (not to be classified)."""
        self.keeping = False
        self.request.clear()
        self.response.clear()

    @property
    def tool_calling(self) -> bool:
        return self.method == b"POST" and not self.probe and self.marker


@dataclass
class Hooks:
    """What the observer reports to (the tap's metrics and classifier link)."""

    request: Callable[[bool], None]  # a request ended; True when it offered tools
    # A tool-calling exchange ended: its (request, response) bodies; True when the classifier
    # took them (a drop is the link's to count).
    exchange: Callable[[bytes, bytes], bool]
    too_large: Callable[[], None]  # a tool-calling exchange over the capture limit
    unobserved: Callable[[Unobserved], None]  # a connection no longer read, and why
    capture_limit: int


class ConnectionObserver:
    """Both directions of one connection, fed as the relay forwards them."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks
        self.active = True
        self._pending: deque[Exchange] = deque()  # requests whose responses have not ended
        self._requests = httptools.HttpRequestParser(_RequestSide(self))
        self._response_side = _ResponseSide(self)
        self._responses = httptools.HttpResponseParser(self._response_side)

    def feed_request(self, data: bytes) -> None:
        if self.active:
            self._feed(self._requests, data)

    def feed_response(self, data: bytes) -> None:
        # Once per streamed chunk: _feed inlined.
        if self.active:
            try:
                self._responses.feed_data(data)
            except Exception as exc:
                self._failed(exc)

    def router_closed(self) -> None:
        """The router closed the connection: a response still being read ends here (one that
        ends with the close, as HTTP says, or one cut short), and it is accounted as the
        client got it. Nothing more comes on this connection."""
        if self.active:
            try:
                self._response_side.end()
            except Exception:  # as in _feed: never reaches the relay
                log.exception("the tap could not account a response ended by a close")
            self.active = False

    def _feed(
        self, parser: httptools.HttpRequestParser | httptools.HttpResponseParser, data: bytes
    ) -> None:
        try:
            parser.feed_data(data)
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if isinstance(exc, httptools.HttpParserUpgrade):
            self.stop(Unobserved.UPGRADE)
        elif isinstance(exc, httptools.HttpParserError):
            self.stop(Unobserved.UNPARSABLE)
        else:  # a fault here must never reach the relay: stop reading, go on
            log.error(
                "the tap stopped reading a connection after an error (still relayed)",
                exc_info=exc,
            )
            self.stop(Unobserved.UNPARSABLE)

    def stop(self, reason: Unobserved) -> None:
        if self.active:
            self.active = False
            self._pending.clear()
            self.hooks.unobserved(reason)


class _RequestSide:
    """httptools callbacks for the client's requests."""

    def __init__(self, observer: ConnectionObserver) -> None:
        self.observer = observer
        self.current = Exchange()

    def on_message_begin(self) -> None:
        self.current = Exchange()
        self.observer._pending.append(self.current)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == _PROBE:
            self.current.probe = True

    def on_headers_complete(self) -> None:
        self.current.method = self.observer._requests.get_method()
        if self.current.method == b"HEAD":
            self.observer.stop(Unobserved.HEAD)

    def on_body(self, body: bytes) -> None:
        if self.current.method == b"POST" and not self.current.probe:
            self.current.request_part(body, self.observer.hooks.capture_limit)

    def on_message_complete(self) -> None:
        exchange = self.current
        exchange.ended = True
        if not exchange.tool_calling:
            exchange.let_go()
        self.observer.hooks.request(exchange.tool_calling)


class _ResponseSide:
    """httptools callbacks for the router's responses, matched to requests in order."""

    def __init__(self, observer: ConnectionObserver) -> None:
        self.observer = observer
        self.limit = observer.hooks.capture_limit
        self.interim = False
        self.reading = False  # a response has begun and not ended
        self.capturing: Exchange | None = None  # whose response body is kept, if any

    def on_message_begin(self) -> None:
        self.reading, self.interim = True, False

    def end(self) -> None:
        """The connection closed: what was read of the current response is all of it."""
        if self.reading:
            self.on_message_complete()

    def on_headers_complete(self) -> None:
        status = self.observer._responses.get_status_code()
        self.interim = 100 <= status < 200  # 100 Continue: the real response follows
        pending = self.observer._pending
        if not pending:
            self.observer.stop(Unobserved.UNPARSABLE)  # a response to no request
        self.capturing = pending[0] if pending and pending[0].keeping else None

    def on_body(self, body: bytes) -> None:
        # Once per streamed chunk: the exchange was looked up at the response's head, and
        # Exchange._keep is inlined.
        exchange = self.capturing
        if exchange is not None and exchange.keeping:
            exchange.size += len(body)
            if exchange.size > self.limit:
                exchange.overflow = True  # too large to classify: still forwarded, counted
                exchange.let_go()
            else:
                exchange.response.append(body)

    def on_message_complete(self) -> None:
        self.reading, self.capturing = False, None
        if self.interim or not self.observer._pending:
            return
        exchange = self.observer._pending.popleft()
        if not (exchange.tool_calling and exchange.ended):
            return
        if exchange.overflow:
            self.observer.hooks.too_large()
        else:
            request = b"".join(exchange.request)
            self.observer.hooks.exchange(request, b"".join(exchange.response))

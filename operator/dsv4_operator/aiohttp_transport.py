"""An httpx transport whose connections are aiohttp's: httpx's API, aiohttp's connection pool.

httpcore's pool checks every kept connection before each request: 0.45-0.57 ms of CPU per
request one at a time and 1.9-2.1 ms with 64 in flight (a canary run's sessions), against
0.26-0.41 ms here with kept connections (`python bench/http_client.py`, two runs). The guard
makes ~120 requests a second at 100 deployments; the Kubernetes client (kube/client.py) a
dozen per deployment it creates, up to 16 at once.

Written here rather than taken from httpx-aiohttp (0.2.0), whose error map takes the first
aiohttp class that matches: a refused connection came out as `httpx.ConnectTimeout`, and so
did a server that closed the connection after the request went out, which the canary would
then retry. Here the httpx error says when it happened, as httpx's own transport does:
`ConnectError`/`ConnectTimeout` before the request was sent, `RemoteProtocolError`,
`ReadError` or `ReadTimeout` after.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from urllib.request import getproxies

import aiohttp
import httpx

# Most specific first: the first class an aiohttp error is an instance of names the httpx one.
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),  # connect, or the pool's wait
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),  # sock_read: no byte for that long
    (aiohttp.ClientProxyConnectionError, httpx.ProxyError),
    (aiohttp.ClientConnectorError, httpx.ConnectError),  # refused, unreachable, DNS, TLS
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),  # closed without an answer
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),  # an answer that is not HTTP
    (aiohttp.ClientPayloadError, httpx.ReadError),  # the body broke off
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    (aiohttp.ClientError, httpx.ReadError),  # a reset or other socket error after connecting
)
CHUNK = 64 * 1024


@contextmanager
def as_httpx(request: httpx.Request | Callable[[], httpx.Request]) -> Iterator[None]:
    """aiohttp's errors raised as the httpx ones (`request`, or a function that makes it
    when one is raised)."""
    try:
        yield
    except aiohttp.ClientError as error:
        kind = next(theirs for ours, theirs in _ERRORS if isinstance(error, ours))
        made = request if isinstance(request, httpx.Request) else request()
        raise kind(str(error) or type(error).__name__, request=made) from error


class _Body(httpx.AsyncByteStream):
    """The response body as aiohttp reads it; closing it gives the connection back."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response, self._request = response, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with as_httpx(self._request):
            async for chunk in self._response.content.iter_chunked(CHUNK):
                yield chunk

    async def aclose(self) -> None:
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Sends httpx requests through an `aiohttp.ClientSession`, made by `session()` on the
    first request (inside the running loop, as aiohttp wants) and closed with the transport.
    The session should neither keep cookies nor decompress: httpx does both."""

    def __init__(self, session: Callable[[], aiohttp.ClientSession]) -> None:
        self._make = session
        self._session: aiohttp.ClientSession | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._session is None:
            self._session = self._make()
        timeout = request.extensions.get("timeout", {})
        with as_httpx(request):
            response = await self._session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=await request.aread() or None,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
            )
        return httpx.Response(
            response.status,
            headers=list(response.raw_headers),
            stream=_Body(response, request),
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": response.reason.encode()}
            if response.reason
            else {"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def environment_proxies() -> dict[str, str]:
    """The proxies the environment names for http, https or all schemes (what httpx reads,
    through the same `urllib.request.getproxies`): where one is named, a client keeps httpx's
    own transport and its proxy rules."""
    found = getproxies()
    return {scheme: found[scheme] for scheme in ("http", "https", "all") if found.get(scheme)}


def aiohttp_session(
    tls: ssl.SSLContext, keepalive: float | None, decompress: bool = False
) -> Callable[[], aiohttp.ClientSession]:
    """What makes an aiohttp session: no bound on connections (the callers bound their own
    requests), each kept `keepalive` seconds (None: closed after each request), no cookies;
    no decompression unless `decompress` (an `AiohttpTransport` leaves both cookies and
    content decoding to httpx)."""

    def session() -> aiohttp.ClientSession:  # made on the first request, inside the loop
        connector = (
            aiohttp.TCPConnector(limit=0, ssl=tls, force_close=True)
            if keepalive is None
            else aiohttp.TCPConnector(limit=0, ssl=tls, keepalive_timeout=keepalive)
        )
        return aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=decompress
        )

    return session

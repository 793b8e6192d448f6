"""The guard's HTTP clients, made once per operator and shared by every deployment's loops.

httpx's API (requests, timeouts, exceptions) over aiohttp's connections (../aiohttp_transport.py)
for what a spec names; the canary's requests and the pods' pages (taps, engines), most of an
idle guard's requests, on aiohttp directly (`AiohttpExchanges`), with httpx's exceptions. The
guard makes ~120 requests a second at 100 deployments.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx

from dsv4_operator.aiohttp_transport import (
    AiohttpTransport,
    aiohttp_session,
    as_httpx,
    environment_proxies,
)
from dsv4_operator.canary.transport import KEEPALIVE_S, Exchanges, HttpxExchanges

# Requests without their own timeout (Prometheus); the canary and the scrapes set theirs.
DEFAULT_TIMEOUT = 10.0


class Pages(Protocol):
    """What a scrape needs of a client: one page's text, or an `httpx.HTTPError` (a status
    other than 2xx is `httpx.HTTPStatusError`)."""

    async def text(self, url: str, timeout: float) -> str: ...


@dataclass(frozen=True)
class HttpxPages:
    """Pages read with an httpx client (the URLs a spec names; tests' mock transports)."""

    client: httpx.AsyncClient

    async def text(self, url: str, timeout: float) -> str:
        reply = await self.client.get(url, timeout=timeout)
        reply.raise_for_status()
        return reply.text


class AiohttpExchanges:
    """Requests on aiohttp directly, never through a proxy, with httpx's errors as its
    transport would raise them (../aiohttp_transport.py). Without httpx's request and response
    objects a request costs half the CPU or less (`python bench/http_client.py`).

    `keep`: connections kept `KEEPALIVE_S` between requests (the canary: a run's rounds reuse
    them; between two runs they have expired; canary/transport.py says why 2 s), else closed
    after each (pod pages: each pod is read once per interval, and a kept socket per engine
    and tap pod would be thousands at 1,000 deployments).
    """

    def __init__(self, tls: ssl.SSLContext, keep: bool) -> None:
        self._make = aiohttp_session(tls, KEEPALIVE_S if keep else None, decompress=True)
        self._session: aiohttp.ClientSession | None = None

    async def reply(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
        *,
        connect: float | None = None,
    ) -> tuple[int, bytes, str | None]:
        """The reply's status, whole body and charset (None when it names none). `timeout`
        bounds connecting and each wait for bytes; `connect`, if given, connecting alone (a
        tap's canary run answers after tens of seconds, a dead pod should fail in seconds)."""
        if self._session is None:  # made on the first request, inside the running loop
            self._session = self._make()
        connect = timeout if connect is None else connect
        limits = aiohttp.ClientTimeout(connect=connect, sock_connect=connect, sock_read=timeout)
        with as_httpx(lambda: httpx.Request(method, url)):
            async with self._session.request(
                method, url, data=body, headers=headers, allow_redirects=False, timeout=limits
            ) as reply:
                return reply.status, await reply.read(), reply.charset

    async def exchange(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
        *,
        connect: float | None = None,
    ) -> tuple[int, bytes]:
        status, content, _ = await self.reply(method, url, body, headers, timeout, connect=connect)
        return status, content

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class PodPages:
    """Pod IPs' pages (the router pods' taps, the engine pods), most of an idle guard's reads
    besides the canary: one request each, no connection kept."""

    def __init__(self, tls: ssl.SSLContext) -> None:
        self.exchanges = AiohttpExchanges(tls, keep=False)  # also a tap's canary runs

    async def text(self, url: str, timeout: float) -> str:
        status, body, charset = await self.exchanges.reply("GET", url, None, {}, timeout)
        if not 200 <= status < 300:  # as httpx's raise_for_status: a redirect is not a page
            request = httpx.Request("GET", url)
            raise httpx.HTTPStatusError(
                f"{status} from {url}", request=request, response=httpx.Response(status)
            )
        try:
            return body.decode(charset or "utf-8", errors="replace")
        except LookupError:  # a charset Python does not know: read as httpx would, UTF-8
            return body.decode("utf-8", errors="replace")

    async def aclose(self) -> None:
        await self.exchanges.aclose()


class BoundedPages:
    """`pages` with at most `at_once` reads in flight; the others wait their turn, in order.

    A read's timeout runs from when it has a slot, not from when it was due: an operator
    whose loop is saturated (a fleet's guards all waking at once) otherwise timed out its
    own reads (a connect's reply waited behind hundreds of other reads' parses), reported
    the taps unreachable and read them again at once, which loaded the loop further
    (bench/scale.py, N = 1,000). `waited(seconds)` is told how long each read waited for its
    slot, `held(seconds)` how long it then held it (answered or failed): long waits with short
    reads mean more reads than slots, long reads mean slow pages or a slow loop."""

    def __init__(
        self,
        pages: Pages,
        at_once: int,
        waited: Callable[[float], None],
        held: Callable[[float], None],
    ) -> None:
        self.pages = pages
        self.waited, self.held = waited, held
        self._slots = asyncio.Semaphore(at_once)

    async def text(self, url: str, timeout: float) -> str:
        clock = asyncio.get_running_loop()
        due = clock.time()
        async with self._slots:
            began = clock.time()
            self.waited(began - due)
            try:
                return await self.pages.text(url, timeout)
            finally:
                self.held(clock.time() - began)


@dataclass(frozen=True)
class GuardHttp:
    """The spec URLs' client, the canary's exchanges and the pods' pages, with one TLS
    context between them.

    `spec_urls` reads the other URLs a spec names (Prometheus, tap.metricsEndpoints): it
    follows HTTP(S)_PROXY and NO_PROXY, as any client would. `canary` reaches the canary's
    endpoint (the router Service or canary.endpoint) and each culprit-search shadow router's
    Service on aiohttp, or on `spec_urls` when the environment names a proxy (httpx's rules
    for it, as for every spec URL). `pods` reads pod IPs (the router pods' taps, the engine
    pods): never through a proxy, since httpx's NO_PROXY takes no CIDR ranges and a
    cluster-wide HTTP_PROXY would otherwise catch every pod IP. Building a TLS
    context loads the CA bundle, which cost about a fifth of an idle operator's CPU when every
    canary run made a client of its own.
    """

    spec_urls: httpx.AsyncClient
    canary: Exchanges
    pods: PodPages

    @classmethod
    def create(cls) -> GuardHttp:
        tls = httpx.create_ssl_context()
        spec_urls = _client(tls)
        canary: Exchanges = (
            HttpxExchanges(spec_urls) if environment_proxies() else AiohttpExchanges(tls, keep=True)
        )
        return cls(spec_urls=spec_urls, canary=canary, pods=PodPages(tls))

    async def close(self) -> None:
        await self.spec_urls.aclose()
        if isinstance(self.canary, AiohttpExchanges):
            await self.canary.aclose()
        await self.pods.aclose()


def _client(tls: ssl.SSLContext) -> httpx.AsyncClient:
    """No bound on open connections (a canary opens one per session, and the supervisor
    bounds how many canaries run at once).

    httpx reads HTTP(S)_PROXY, ALL_PROXY and NO_PROXY only for its own transport: when the
    environment names a proxy, the client keeps httpx's transport (and its proxy rules,
    unchanged); the connections are aiohttp's otherwise.
    """
    if environment_proxies():
        return _httpx_client(tls, None, trust_env=True)
    return _httpx_client(tls, AiohttpTransport(aiohttp_session(tls, KEEPALIVE_S)), trust_env=False)


def _httpx_client(
    tls: ssl.SSLContext, transport: httpx.AsyncBaseTransport | None, trust_env: bool
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=transport,
        verify=tls,
        trust_env=trust_env,
        timeout=DEFAULT_TIMEOUT,
        follow_redirects=False,
        # (max_keepalive_connections bounds httpx's own pool only: it polls every kept
        # connection before each request, encode/httpcore#1035.)
        limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=32, keepalive_expiry=KEEPALIVE_S
        ),
    )

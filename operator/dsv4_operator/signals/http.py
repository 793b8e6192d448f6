"""The guard's HTTP clients, made once per operator and shared by every deployment's loops.

httpx's API (requests, timeouts, exceptions) over aiohttp's connections (aiohttp_transport.py):
the guard makes ~120 requests a second at 100 deployments.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.request import getproxies

import aiohttp
import httpx

from dsv4_operator.signals.aiohttp_transport import AiohttpTransport

# Requests without their own timeout (Prometheus); the canary and the scrapes set theirs.
DEFAULT_TIMEOUT = 10.0
# How long a connection is kept between two requests: a canary run's rounds reuse its
# sessions' connections; between two runs (the interval) it has expired.
KEEPALIVE_S = 5.0


@dataclass(frozen=True)
class GuardHttp:
    """Two connection pools with one TLS context between them.

    `spec_urls` reads what a spec names (the canary's endpoint and the router Service, each
    culprit-search shadow router's Service, Prometheus, tap.metricsEndpoints): it follows
    HTTP(S)_PROXY and NO_PROXY, as any client would. `pods` reads pod IPs (the router pods'
    taps, the engine pods): never through a proxy, since httpx's NO_PROXY takes no CIDR
    ranges and a cluster-wide HTTP_PROXY would otherwise catch every pod IP. Building a TLS
    context loads the CA bundle, which cost about a fifth of an idle operator's CPU when every
    canary run made a client of its own.
    """

    spec_urls: httpx.AsyncClient
    pods: httpx.AsyncClient

    @classmethod
    def create(cls) -> GuardHttp:
        tls = httpx.create_ssl_context()
        return cls(
            spec_urls=_client(tls, trust_env=True, keep_alive=True),
            pods=_client(tls, trust_env=False, keep_alive=False),
        )

    async def close(self) -> None:
        await self.spec_urls.aclose()
        await self.pods.aclose()


def _client(tls: ssl.SSLContext, trust_env: bool, keep_alive: bool) -> httpx.AsyncClient:
    """No bound on open connections (a canary opens one per session, and the supervisor
    bounds how many canaries run at once). Pod reads keep no connection: each pod is read
    once per tap or engine interval (5 s by default, the keep-alive time), and a kept one
    per engine and tap pod would hold thousands of sockets open at 1,000 deployments.

    httpx reads HTTP(S)_PROXY, ALL_PROXY and NO_PROXY only for its own transport: when the
    environment names a proxy, a client that follows it keeps httpx's transport (and its
    proxy rules, unchanged); the connections are aiohttp's otherwise.
    """
    if trust_env and environment_proxies():
        return _httpx_client(tls, None, trust_env=True)

    def session() -> aiohttp.ClientSession:  # made on the first request, inside the loop
        connector = (
            aiohttp.TCPConnector(limit=0, ssl=tls, keepalive_timeout=KEEPALIVE_S)
            if keep_alive
            else aiohttp.TCPConnector(limit=0, ssl=tls, force_close=True)
        )
        # httpx keeps the cookies (none here) and decodes the content: aiohttp does neither.
        return aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False
        )

    return _httpx_client(tls, AiohttpTransport(session), trust_env=False)


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


def environment_proxies() -> dict[str, str]:
    """The proxies the environment names for http, https or all schemes (what httpx reads,
    through the same `urllib.request.getproxies`)."""
    found = getproxies()
    return {scheme: found[scheme] for scheme in ("http", "https", "all") if found.get(scheme)}

"""The guard's HTTP clients, made once per operator and shared by every deployment's loops."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import httpx

# Requests without their own timeout (Prometheus); the canary and the scrapes set theirs.
DEFAULT_TIMEOUT = 10.0
# No bound on open connections (a canary opens one per session, and the supervisor bounds
# how many canaries run at once); few idle ones kept: httpcore's pool gets slow with many
# idle connections (encode/httpcore#1035), and between two runs of one deployment's canary
# (its interval) a kept connection would expire anyway.
LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=32, keepalive_expiry=5.0)
# Pod reads keep no connection: each pod is read once per tap or engine interval (5 s by
# default, the keep-alive expiry), so a kept one had mostly expired by its next use, while
# every request first checked each kept connection (a socket poll through anyio apiece).
POD_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=0)


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
            spec_urls=_client(tls, trust_env=True, limits=LIMITS),
            pods=_client(tls, trust_env=False, limits=POD_LIMITS),
        )

    async def close(self) -> None:
        await self.spec_urls.aclose()
        await self.pods.aclose()


def _client(tls: ssl.SSLContext, trust_env: bool, limits: httpx.Limits) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        verify=tls,
        trust_env=trust_env,
        timeout=DEFAULT_TIMEOUT,
        follow_redirects=False,
        limits=limits,
    )

"""The tap's proxy: forwards every request to the router byte for byte, streams each response
chunk on as it arrives, and hands a copy of tool-calling exchanges to the classifier after
the response has ended (never before, never waiting for it). Content is neither stored nor
logged: the copy lives until the classifier has its verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dsv4_operator.probe.transport import PROBE_HEADER
from dsv4_operator.tap.classify import TOOLS_MARKER
from dsv4_operator.tap.metrics import TapMetrics
from dsv4_operator.tap.worker import ClassifierLink

log = logging.getLogger(__name__)

# Per connection, not end to end (RFC 9110 7.6.1); Host and length are set by each side.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
#: Responses larger than this are forwarded but not classified (counted as skipped).
CAPTURE_LIMIT = 4 << 20
SUPERVISE_SECONDS = 1.0
PROBE_HEADER_NAME = next(iter(PROBE_HEADER))


@dataclass(frozen=True)
class TapConfig:
    upstream: str  # the router, e.g. http://127.0.0.1:8000
    deployment: str
    capture_limit: int = CAPTURE_LIMIT


def _forwarded(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The end-to-end headers, repeated ones (Set-Cookie) kept, in order."""
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


class Tap:
    """The proxy handler, its classifier link and its metrics."""

    def __init__(
        self,
        config: TapConfig,
        link: ClassifierLink | None = None,
        supervise_seconds: float = SUPERVISE_SECONDS,
    ) -> None:
        self.config = config
        self.supervise_seconds = supervise_seconds
        self.link = link or ClassifierLink()
        self.metrics = TapMetrics(self.link, config.deployment)
        self._session: aiohttp.ClientSession | None = None
        self._supervisor: asyncio.Task[None] | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=30)
        # auto_decompress off: bodies pass through as the router encoded them.
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        if not self.link.alive():
            self.link.start()
        self._supervisor = asyncio.create_task(self._supervise())

    async def close(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self._session is not None:
            await self._session.close()
        await asyncio.to_thread(self.link.stop)

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self.supervise_seconds)
            await self.supervise_once()

    async def supervise_once(self) -> None:
        """Restart the classifier if it died (the supervisor does this every few seconds)."""
        if await asyncio.to_thread(self.link.ensure_running):
            log.warning("the tap's classifier had died; restarted it (traffic was not held)")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        body = await request.read()
        # The canary's own requests are its to count, not production traffic.
        probe = PROBE_HEADER_NAME in request.headers
        tool_calling = request.method == "POST" and not probe and TOOLS_MARKER in body
        (self.metrics.tool_requests if tool_calling else self.metrics.other_requests).inc()
        assert self._session is not None, "Tap.start() first"
        # The tap's own time on a request: reading it and deciding, up to forwarding it (what
        # follows is the router's time to answer, not the tap's).
        self.metrics.request_latency.observe(time.perf_counter() - arrived)
        try:
            upstream = await self._session.request(
                request.method,
                self.config.upstream + request.path_qs,
                data=body,
                headers=_forwarded(request.headers),
                allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError) as exc:
            self.metrics.upstream_errors.inc()
            return web.Response(status=502, text=f"dsv4 tap: router unreachable: {exc}\n")
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            response.headers.extend(_forwarded(upstream.headers))
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            captured: list[bytes] | None = [] if tool_calling else None
            size = 0
            async for chunk in _chunks(upstream):
                got = time.perf_counter()
                await response.write(chunk)
                self.metrics.chunk_latency.observe(time.perf_counter() - got)
                if captured is not None:
                    size += len(chunk)
                    if size > self.config.capture_limit:
                        captured = None
                        self.metrics.too_large.inc()
                    else:
                        captured.append(chunk)
            await response.write_eof()
        if captured is not None:
            self.link.submit(body, b"".join(captured))
        return response

    async def serve_metrics(self, request: web.Request) -> web.Response:
        payload = await asyncio.to_thread(generate_latest, self.metrics.registry)
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _chunks(upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body as the network delivers it (no re-chunking, no waiting for more)."""
    async for chunk in upstream.content.iter_any():
        yield chunk


def proxy_app(tap: Tap) -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    app.router.add_route("*", "/{tail:.*}", tap.handle)
    return app


def metrics_app(tap: Tap) -> web.Application:
    app = web.Application()
    app.router.add_get("/metrics", tap.serve_metrics)
    return app


async def run_tap(config: TapConfig, listen: tuple[str, int], metrics: tuple[str, int]) -> None:
    """Serve until cancelled."""
    tap = Tap(config)
    await tap.start()
    runners = [web.AppRunner(proxy_app(tap), access_log=None), web.AppRunner(metrics_app(tap))]
    try:
        for runner, (host, port) in zip(runners, (listen, metrics), strict=True):
            await runner.setup()
            await web.TCPSite(runner, host, port).start()
        log.info("tap on %s:%d -> %s (metrics on %s:%d)", *listen, config.upstream, *metrics)
        await asyncio.Event().wait()
    finally:
        for runner in runners:
            await runner.cleanup()
        await tap.close()

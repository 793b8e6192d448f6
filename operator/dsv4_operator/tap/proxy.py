"""The leak tap: a relay to the router (`tap.relay`) that copies tool-calling exchanges to the
classifier after each response has ended (never before, never waiting for it), the
classifier's supervision, and /metrics. Content is neither stored nor logged: the copy lives
until the classifier has its verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dsv4_operator.tap.metrics import TapMetrics
from dsv4_operator.tap.observe import Hooks
from dsv4_operator.tap.relay import Relay
from dsv4_operator.tap.worker import ClassifierLink

log = logging.getLogger(__name__)

#: Exchanges larger than this (request and response) are forwarded but not classified.
CAPTURE_LIMIT = 4 << 20
SUPERVISE_SECONDS = 1.0
LOOP_PROBE_SECONDS = 0.05


@dataclass(frozen=True)
class TapConfig:
    upstream: str  # the router, e.g. http://127.0.0.1:8000
    deployment: str  # the DSV4Deployment's bare name
    capture_limit: int = CAPTURE_LIMIT
    namespace: str = "default"
    canary_runs_at_once: int = 1  # the guard's runs against the router (0: no /canary)

    @property
    def scope(self) -> tuple[str, str]:
        """The values of series.SCOPE on every series the tap exports."""
        return (self.namespace, self.deployment)

    def router_address(self) -> tuple[str, int]:
        """(host, port) of `upstream`; ValueError naming what is wrong."""
        parts = urlsplit(self.upstream)
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(
                f"upstream {self.upstream!r}: expected http://host:port (the router in the same "
                "pod, plain HTTP, no path)"
            )
        return parts.hostname, parts.port or 80


class Tap:
    """The relay, its classifier link and its metrics."""

    def __init__(
        self,
        config: TapConfig,
        link: ClassifierLink | None = None,
        supervise_seconds: float = SUPERVISE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.supervise_seconds = supervise_seconds
        self.clock = clock  # what the loop-lag watch reads
        self.link = link or ClassifierLink()
        self.metrics = metrics = TapMetrics(self.link, config.scope)
        hooks = Hooks(
            request=lambda tools: (
                metrics.tool_requests if tools else metrics.other_requests
            ).inc(),
            exchange=self.link.submit,
            too_large=metrics.too_large.inc,
            unobserved=lambda reason: metrics.unobserved[reason].inc(),
            capture_limit=config.capture_limit,
        )
        host, port = config.router_address()
        self.relay = Relay(
            host,
            port,
            hooks,
            request_forwarded=metrics.request_latency.observe,
            chunk_written=metrics.chunk_latency.observe,
            upstream_error=metrics.upstream_errors.inc,
        )
        self._supervisor: asyncio.Task[None] | None = None
        self._loop_watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if not self.link.alive():
            self.link.start()
        self._supervisor = asyncio.create_task(self._supervise())
        self._loop_watch = asyncio.create_task(self._watch_loop())

    async def listen(self, host: str, port: int, reuse_port: bool = False) -> tuple[str, int]:
        """Relay connections accepted on (host, port) to the router; the address bound."""
        return await self.relay.listen(host, port, reuse_port)

    async def close(self) -> None:
        for task in (self._supervisor, self._loop_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.relay.close()
        await self.link.close()

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self.supervise_seconds)
            try:
                await self.supervise_once()
            except Exception:  # out of processes or descriptors, say: the next pass tries again
                log.exception("the tap could not restart its classifier (traffic goes on)")

    async def _watch_loop(self) -> None:
        """Observe how late the loop runs a timer: the queueing the relay adds when busy,
        which the per-write figures cannot see."""
        while True:
            due = self.clock() + LOOP_PROBE_SECONDS
            await asyncio.sleep(LOOP_PROBE_SECONDS)
            self.metrics.loop_lag.observe(max(0.0, self.clock() - due))

    async def supervise_once(self) -> None:
        """Restart the classifier if it died (the supervisor does this every second)."""
        if self.link.alive():
            return
        # Starting a process takes milliseconds: off the loop; the switch to it, on the loop.
        self.link.adopt(await asyncio.to_thread(self.link.spawn))
        log.warning("the tap's classifier had died; restarted it (traffic was not held)")

    async def serve_metrics(self, request: web.Request) -> web.Response:
        payload = await asyncio.to_thread(generate_latest, self.metrics.registry)
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})


def metrics_app(tap: Tap, canary: bool = True) -> web.Application:
    """/metrics, and /canary unless `canary` is False (a worker's app: its parent serves it)."""
    app = web.Application()
    app.router.add_get("/metrics", tap.serve_metrics)
    if canary:
        add_canary(app, tap.config)
    return app


def add_canary(app: web.Application, config: TapConfig) -> None:
    """`POST /canary` (canary/remote.py): the guard's canary runs against the router, with a
    client made once and closed with the app."""
    if config.canary_runs_at_once < 1:
        return
    from dsv4_operator.canary.remote import CANARY_PATH, CanaryService
    from dsv4_operator.signals.http import AiohttpExchanges

    # The router is plain HTTP in the same pod (`router_address`): no CA bundle to load.
    client = AiohttpExchanges(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), keep=True)
    service = CanaryService(config.upstream, client, config.canary_runs_at_once)
    app.router.add_post(CANARY_PATH, service.handle)

    async def close(_: web.Application) -> None:
        await client.aclose()

    app.on_cleanup.append(close)


async def run_tap(
    config: TapConfig,
    listen: tuple[str, int],
    metrics: tuple[str, int] | str,
    reuse_port: bool = False,
    ready: Callable[[], None] | None = None,
) -> None:
    """Serve until cancelled; /metrics on (host, port), or on a Unix socket at a path (a
    worker of `tap.workers`, read by its parent). `ready` is called once both listen."""
    tap = Tap(config)
    await tap.start()
    runner = web.AppRunner(metrics_app(tap, canary=not isinstance(metrics, str)))
    try:
        await runner.setup()
        if isinstance(metrics, str):
            await web.UnixSite(runner, metrics).start()
        else:
            await web.TCPSite(runner, *metrics).start()
        await tap.listen(*listen, reuse_port=reuse_port)
        # What exists now (modules, the app) lives as long as the process: kept out of the
        # collector's full passes, which otherwise stall the loop for tens of milliseconds.
        gc.freeze()
        where = metrics if isinstance(metrics, str) else f"{metrics[0]}:{metrics[1]}"
        log.info("tap on %s:%d -> %s (metrics on %s)", *listen, config.upstream, where)
        if ready is not None:
            ready()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await tap.close()

"""Benchmark: CPU per request of httpx's own transport against the guard's clients (httpx over
aiohttp's connections for spec URLs, aiohttp directly for the canary and pod pages;
signals/http.py), one request at a time and many in flight.

A small HTTP/1.1 server in another process answers every request with the same body (about
the size of an engine's /metrics page cut to the counted families); the client process counts
its own CPU time (user + system) over `--requests` GETs, after a warm-up. Each mode runs in
the same run, interleaved over `--rounds`, and the median is printed:

    python bench/http_client.py [--requests 3000] [--in-flight 1 64] [--rounds 3]

The guard at 100 deployments makes ~120 requests a second (canary sessions, tap and engine
reads); the figure per request times that rate is the share of a core the requests alone cost.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import uvloop

from dsv4_devcluster.process import ManagedProcess, exit_on_sigterm, free_port, wait_listening
from dsv4_operator.signals.http import AiohttpExchanges, GuardHttp, HttpxPages, PodPages

SERVER = """
import asyncio, sys
BODY = b"x" * int(sys.argv[2])
HEAD = b"HTTP/1.1 200 OK\\r\\nContent-Type: text/plain\\r\\nContent-Length: %d\\r\\n\\r\\n"
ANSWER = HEAD % len(BODY) + BODY
async def handle(reader, writer):
    try:
        while True:
            await reader.readuntil(b"\\r\\n\\r\\n")
            writer.write(ANSWER)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    await server.serve_forever()
asyncio.run(main())
"""

Client = tuple[Callable[[str], Awaitable[str]], Callable[[], Awaitable[None]]]


def _httpx(client: httpx.AsyncClient) -> Client:
    """A page's text through an httpx client, as the guard reads the URLs a spec names."""
    return (lambda url: HttpxPages(client).text(url, 10.0)), client.aclose


def _pods() -> Client:
    pages = PodPages(httpx.create_ssl_context())
    return (lambda url: pages.text(url, 10.0)), pages.aclose


def _canary() -> Client:
    exchanges = AiohttpExchanges(httpx.create_ssl_context(), keep=True)

    async def read(url: str) -> str:
        _, body = await exchanges.exchange("GET", url, None, {}, 10.0)
        return body.decode()

    return read, exchanges.aclose


CLIENTS: dict[str, Callable[[], Client]] = {
    "httpx, kept connections": lambda: _httpx(
        httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
            trust_env=False,
        )
    ),
    "httpx, no kept connection": lambda: _httpx(
        httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
            trust_env=False,
        )
    ),
    "guard, kept connections (spec URLs)": lambda: _httpx(GuardHttp.create().spec_urls),
    "guard, kept connections (canary)": _canary,
    "guard, no kept connection (pod pages)": _pods,
}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _per_request_ms(make: Callable[[], Client], url: str, n: int, flight: int) -> float:
    read, close = make()
    try:

        async def worker(count: int) -> None:
            for _ in range(count):
                await read(url)

        each = max(1, n // flight)
        await asyncio.gather(*(worker(max(1, each // 10)) for _ in range(flight)))  # warm-up
        began = _cpu()
        await asyncio.gather(*(worker(each) for _ in range(flight)))
        return (_cpu() - began) / (each * flight) * 1e3
    finally:
        await close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--body", type=int, default=4000, help="response bytes")
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="dsv4-http-bench-") as logs:
        # Left running, the server would hold its port: killed on SIGTERM, and by the kernel
        # should the bench die otherwise (ManagedProcess).
        exit_on_sigterm(lambda: shutil.rmtree(logs, ignore_errors=True))
        server = ManagedProcess(
            "server", [sys.executable, "-c", SERVER, str(port), str(args.body)],
            Path(logs) / "server.log",
        )  # fmt: skip
        try:
            wait_listening(port, server.popen)
            print(f"server (pid {server.pid}) on port {port}; measuring", flush=True)
            _measure(args, f"http://127.0.0.1:{port}/metrics")
        finally:
            server.stop()


def _measure(args: argparse.Namespace, url: str) -> None:
    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for flight in args.in_flight:
            for name, make in CLIENTS.items():
                ms = uvloop.run(_per_request_ms(make, url, args.requests, flight))
                results.setdefault((name, flight), []).append(ms)
    print(f"CPU per request, ms (median of {args.rounds} rounds, {args.requests} requests)")
    print(f"{'client':40} " + " ".join(f"{f:>4} in flight" for f in args.in_flight))
    for name in CLIENTS:
        row = [statistics.median(results[(name, f)]) for f in args.in_flight]
        print(f"{name:40} " + " ".join(f"{ms:>14.3f}" for ms in row))


if __name__ == "__main__":
    main()

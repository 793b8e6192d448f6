"""Benchmark of the leak tap's overhead: the same upstream, direct and through the tap.

Three processes: an upstream stand-in (an aiohttp server that streams an SSE chat completion
of `--chunks` chunks of realistic size, `--gap-ms` apart, each preceded by an SSE comment with
its send time on the shared monotonic clock), the tap (`dsv4_operator.tap`, with its
classifier process), and the load generator (aiohttp client). Every request offers tools, so
every response is copied to the classifier: the tap's worst case.

For 1, 64 and 256 concurrent streaming sessions it runs `--seconds` direct, then as long
through the tap, and prints p50/p99 of time to first byte, of the whole request, and of each
chunk's delivery delay (arrival - send), and the tap's added latency (tap - direct) per
request and per chunk. Then a throughput phase (no gaps) prints streamed requests/s and the
tap's requests/s per core (requests / CPU seconds of the tap process, from /proc).

    python bench/tap.py [--seconds 10] [--chunks 40] [--gap-ms 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
# A token or two per chunk, as an engine streams them (about 60-120 bytes of SSE each).
TEXT = "The quick brown fox jumps over the lazy dog while the model keeps on streaming. "


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _upstream(port: int, chunks: int, gap_ms: float) -> None:
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        gap = float(request.headers.get("X-Gap-Ms", gap_ms)) / 1000
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(chunks):
            delta = {"content": TEXT[(i * 7) % 60 : (i * 7) % 60 + 12]}
            data = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
            await response.write(
                f": t={time.monotonic():.6f}\ndata: {json.dumps(data)}\n\n".encode()
            )
            if gap:
                await asyncio.sleep(gap)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


@dataclass
class Samples:
    ttfb: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    chunk: list[float] = field(default_factory=list)
    requests: int = 0


async def _one(session: aiohttp.ClientSession, url: str, gap_ms: float, out: Samples) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    body["tools"] = TOOLS
    start = time.monotonic()
    first: float | None = None
    headers = {"X-Gap-Ms": str(gap_ms)}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        async for line in resp.content:
            now = time.monotonic()
            if first is None:
                first = now
            if line.startswith(b": t="):
                out.chunk.append(now - float(line[4:]))
    end = time.monotonic()
    out.ttfb.append((first or end) - start)
    out.total.append(end - start)
    out.requests += 1


async def _load(url: str, concurrency: int, seconds: float, gap_ms: float) -> Samples:
    out = Samples()
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while time.monotonic() < deadline:
                await _one(session, url, gap_ms, out)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=15.0)
    parser.add_argument("--sessions", default="1,64,256")
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    up_port, tap_port, metrics_port = _free_port(), _free_port(), _free_port()
    upstream = ctx.Process(target=_upstream, args=(up_port, args.chunks, args.gap_ms), daemon=True)
    upstream.start()
    _wait_port(up_port)
    up_url, tap_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{tap_port}"
    # The tap as it runs in the router pod: `dsv4 tap` (it starts its classifier process).
    tap = subprocess.Popen(
        [sys.executable, "-m", "dsv4_operator.cli", "tap", "--upstream", up_url,
         "--listen", f"127.0.0.1:{tap_port}", "--metrics", f"127.0.0.1:{metrics_port}",
         "--deployment", "bench"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _wait_port(tap_port)
    print(
        f"{os.cpu_count()} cores; {args.chunks} chunks per response, {args.gap_ms:g} ms apart; "
        f"{args.seconds:g}s per phase; every request offers tools (all classified)"
    )
    header = "sessions  path    req/s  ttfb p50/p99 ms  total p50/p99 ms  chunk p50/p99 ms"
    print(header)
    added: list[str] = []
    for sessions in (int(s) for s in args.sessions.split(",")):
        runs = {}
        for name, url in (("direct", up_url), ("tap", tap_url)):
            s = asyncio.run(_load(url, sessions, args.seconds, args.gap_ms))
            runs[name] = s
            print(
                f"{sessions:8}  {name:6} {s.requests / args.seconds:6.0f}  "
                f"{_q(s.ttfb, 0.5):6.2f}/{_q(s.ttfb, 0.99):6.2f}  "
                f"{_q(s.total, 0.5):8.1f}/{_q(s.total, 0.99):7.1f}  "
                f"{_q(s.chunk, 0.5):7.3f}/{_q(s.chunk, 0.99):7.3f}"
            )
        d, t = runs["direct"], runs["tap"]
        added.append(
            f"{sessions:8}  per request (ttfb) p50 {_q(t.ttfb, 0.5) - _q(d.ttfb, 0.5):+.3f} ms, "
            f"p99 {_q(t.ttfb, 0.99) - _q(d.ttfb, 0.99):+.3f} ms; per chunk p50 "
            f"{_q(t.chunk, 0.5) - _q(d.chunk, 0.5):+.3f} ms, p99 "
            f"{_q(t.chunk, 0.99) - _q(d.chunk, 0.99):+.3f} ms"
        )
    print("added by the tap (tap - direct):")
    print("\n".join(added))
    # Throughput: no gaps, 64 sessions; the tap's CPU time gives requests/s per core.
    before = _cpu_seconds(tap.pid)
    s = asyncio.run(_load(tap_url, 64, args.seconds, 0.0))
    used = _cpu_seconds(tap.pid) - before
    print(
        f"throughput through the tap (no gaps, 64 sessions): {s.requests / args.seconds:.0f} "
        f"streamed requests/s, tap process CPU {used:.1f}s = "
        f"{s.requests / used if used else float('inf'):.0f} requests/s per core "
        f"(p50 total {statistics.median(s.total) * 1000:.1f} ms)"
    )
    tap.terminate()
    upstream.terminate()
    tap.wait(10)
    upstream.join(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

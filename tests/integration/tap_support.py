"""The router's stand-in for the leak tap's tests: an aiohttp app streaming a tool call (or its
leaked markup), served on a free port of 127.0.0.1; a running `dsv4 tap` process read through
its /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from dsv4_devcluster.process import free_port
from tests.support.polling import until

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
LEAK = '<｜DSML｜tool_calls><｜DSML｜invoke name="get_weather">'
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def sse(chunks: list[dict[str, Any]]) -> list[bytes]:
    """Server-sent events of `chunks`, then `[DONE]`."""
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


def stream_of(leak: bool) -> list[bytes]:
    """A streamed tool call, or (`leak`) the same call leaked as DSML markup in `content`."""
    head = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    deltas: list[dict[str, Any]]
    if leak:
        deltas = [{"role": "assistant", "content": LEAK[:20]}, {"content": LEAK[20:]}]
        finish = "stop"
    else:
        deltas = [{"role": "assistant", "content": None}, {"tool_calls": [{"index": 0, **CALL}]}]
        finish = "tool_calls"
    chunks = [{**head, "choices": [{"index": 0, "delta": d}]} for d in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return sse(chunks)


class Upstream:
    """The router's stand-in: streams the chunks it is given; can hold after the first."""

    def __init__(self) -> None:
        self.hold: asyncio.Event | None = None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        leak = body.get("model") == "leaky"
        if not body.get("stream"):
            message = (
                {"role": "assistant", "content": LEAK, "tool_calls": None}
                if leak
                else {"role": "assistant", "content": None, "tool_calls": [CALL]}
            )
            payload = {"object": "chat.completion", "choices": [{"index": 0, "message": message}]}
            return web.json_response(payload, headers={"X-Upstream": "yes"})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, chunk in enumerate(stream_of(leak)):
            await response.write(chunk)
            if i == 0 and self.hold is not None:
                await self.hold.wait()
        await response.write_eof()
        return response

    async def other(self, request: web.Request) -> web.Response:
        # mtime fixed: gzip stamps the second it compressed in, and a test compares two
        # replies byte for byte (they straddled a second once: a flake, not the tap).
        body = gzip.compress(b"compressed bytes pass through untouched", mtime=0)
        response = web.Response(
            status=418,
            body=body,
            headers={"Content-Encoding": "gzip", "X-Custom": request.query.get("q", "")},
        )
        response.headers.add("Set-Cookie", "a=1")
        response.headers.add("Set-Cookie", "b=2")
        return response


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """`app` served on a free port of 127.0.0.1: its runner and base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


class TapProcess:
    """`dsv4 tap --workers 2` in front of the upstream stand-in."""

    def __init__(self, process: asyncio.subprocess.Process, url: str, metrics: str) -> None:
        self.process, self.url, self.metrics_url = process, url, metrics

    async def text(self) -> str:
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.metrics_url) as reply,
        ):
            return await reply.text()

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = await self.text()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named `name` whose labels include `labels`."""
        return sum(
            value
            for (sample, sample_labels), value in (await self.metrics()).items()
            if sample == name and labels.items() <= dict(sample_labels).items()
        )

    async def settled(self, name: str, want: float, **labels: str) -> None:
        async def reached() -> bool:
            return await self.value(name, **labels) == want

        await until(f"{name}{labels} = {want}", reached)


@contextlib.asynccontextmanager
async def running_tap(
    upstream_url: str, workers: int = 1, *options: str
) -> AsyncIterator[TapProcess]:
    """`dsv4 tap --workers N` (deployment "d") in front of `upstream_url`, once it serves;
    `options`: more of the CLI's."""
    port, metrics = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dsv4_operator.cli", "tap", "--upstream", upstream_url,
        "--listen", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{metrics}",
        "--deployment", "d", "--workers", str(workers), *options,
    )  # fmt: skip
    tap = TapProcess(process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}/metrics")
    try:

        async def serving() -> bool:
            try:  # /metrics answers first, then the relay listens
                await tap.text()
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except (aiohttp.ClientError, OSError):
                return False
            writer.close()
            return workers == 1 or await tap.value("dsv4_tap_workers") == workers

        await until(f"{workers} tap worker(s) serving", serving, timeout=60)
        yield tap
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()

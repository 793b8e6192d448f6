"""The router's stand-in for the leak tap's tests: an aiohttp app streaming a tool call (or its
leaked markup), served on a free port of 127.0.0.1."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

from aiohttp import web

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
        body = gzip.compress(b"compressed bytes pass through untouched")
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

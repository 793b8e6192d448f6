"""The engine double's aiohttp server (a test double for SGLang: no GPU, no model).

Endpoints: `POST /v1/chat/completions` (JSON and `stream: true` SSE), `GET /health`,
`GET /health_generate`, `GET /v1/models`, `GET /get_model_info`, `GET /server_info` (and the
deprecated `/get_server_info`), `GET /metrics` (only with `--enable-metrics`, like SGLang),
`POST /flush_cache`.

Whether a response is corrupted depends on the seed, the conversation and the declared load
(`DSV4_DOUBLE_LOAD`, or the request's `X-DSV4-Double-Load` header; see config.py), never on
how many requests happen to overlap at this server, unless `DSV4_DOUBLE_LOAD=observed` opts in
to that (non-deterministic, for hand-run benchmarks only). Every chat response carries the load
it was answered at in the same header.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dsv4_engine_double import outputs, parsers, shapes
from dsv4_engine_double.config import (
    LOAD_HEADER,
    DoubleConfig,
    corruption_probability,
    parse_config,
    parse_load,
)
from dsv4_engine_double.logs import crash, log
from dsv4_engine_double.metrics import Metrics

# --- load -----------------------------------------------------------------------------------


@dataclass
class Slot:
    """One admitted chat request; `peak` is the most requests running at once during its life
    (read only in the opt-in, non-deterministic `DSV4_DOUBLE_LOAD=observed` mode)."""

    peak: int
    tokens: int


class Load:
    """Chat requests in flight from all clients: running (capped) and queued."""

    def __init__(self, max_running: int | None) -> None:
        self._gate = asyncio.Semaphore(max_running or 1_000_000)
        self._slots: dict[int, Slot] = {}
        self.running = 0
        self.queued = 0
        self.used_tokens = 0

    @contextlib.asynccontextmanager
    async def admit(self, tokens: int) -> AsyncIterator[Slot]:
        self.queued += 1
        try:
            await self._gate.acquire()
        finally:
            self.queued -= 1
        self.running += 1
        self.used_tokens += tokens
        slot = Slot(peak=self.running, tokens=tokens)
        self._slots[id(slot)] = slot
        for other in self._slots.values():
            other.peak = max(other.peak, self.running)
        try:
            yield slot
        finally:
            del self._slots[id(slot)]
            self.running -= 1
            self.used_tokens -= tokens
            self._gate.release()


# --- answers --------------------------------------------------------------------------------


def conversation_rng(seed: int, body: dict[str, Any], purpose: str = "answer") -> random.Random:
    """Draws that depend only on the seed and the conversation (messages and tools).

    `answer(config, body, conversation_rng(seed, body), load, ...)` is exactly what the server
    answers; the simulated latency draws from its own stream (`purpose="latency"`)."""
    salt = [] if purpose == "answer" else [purpose]
    key = json.dumps(
        [seed, body.get("messages"), body.get("tools"), body.get("tool_choice"), *salt],
        sort_keys=True,
        ensure_ascii=False,
    )
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def _tool_choice(body: dict[str, Any], tools: Sequence[dict[str, Any]]) -> str | None:
    """The tool to call, or None for a plain answer."""
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name in shapes.tool_names(tools):
            return str(name)
    names = shapes.tool_names(tools)
    messages = body.get("messages") or []
    done = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool")
    first_user = next(
        (
            str(m.get("content"))
            for m in messages
            if isinstance(m, dict) and m.get("role") == "user"
        ),
        "",
    )
    offset = int(hashlib.sha256(first_user.encode()).hexdigest()[:8], 16)
    return names[(offset + done) % len(names)]


@dataclass
class Answer:
    response: dict[str, Any]
    shape: shapes.Shape | None  # a corrupted answer's shape; None: well-formed or prose
    load: int
    tool: str | None = None  # the call the model meant to make
    output: outputs.Output | None = None  # what the corrupted model generated
    parsed: parsers.Parsed | None = None  # what the release made of it


def answer(
    config: DoubleConfig,
    body: dict[str, Any],
    rng: random.Random,
    load: int,
    prompt_tokens: int,
    request_number: int = 0,
) -> Answer:
    """What a DSML-parsing SGLang with `config` answers at `load` (the declared load) as its
    `request_number`-th chat request (0: past any early noise): a corrupted model output goes
    through the parser of the release `config` runs as."""
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and "function" in t]
    u_corrupt, u_fault = rng.random(), rng.random()
    name = _tool_choice(body, tools)
    output: outputs.Output | None = None
    parsed: parsers.Parsed | None = None
    reasoning_on = config.reasoning_parser is not None
    if name is None:
        message, finish = shapes.prose_answer(
            rng, reasoning="Nothing left to call; I will answer." if reasoning_on else None
        )
    else:
        call = shapes.make_call(tools, name, rng)
        weights = config.fault_probabilities(load, request_number)
        if u_corrupt < corruption_probability(config, load, request_number):
            total = sum(weights.values())
            fault = next(iter(weights))
            acc = 0.0
            for candidate, weight in weights.items():
                acc += weight / total
                if u_fault < acc:
                    fault = candidate
                    break
            kind = outputs.draw(outputs.FAULT_OUTPUTS[fault], config.silent_drop_share, rng)
            output = outputs.generate(kind, tools, call, rng)
            parsed = parsers.parse(config, output, tools)
            message, finish = parsers.message(parsed, rng), parsed.finish
        else:
            reasoning = shapes.reasoning_for(*call, rng) if reasoning_on else None
            message, finish = shapes.well_formed([call], rng, reasoning=reasoning)
    response = shapes.completion(
        message, finish, model=config.name, rng=rng, prompt_tokens=prompt_tokens
    )
    shape = parsed.shape if parsed is not None else None
    return Answer(response, shape, load, name, output, parsed)


# --- app ------------------------------------------------------------------------------------


class EngineDouble:
    """State of one double: config, load, metrics, request count (for the OOM knob)."""

    def __init__(self, config: DoubleConfig) -> None:
        self.config = config
        self.load = Load(config.max_running_requests)
        self.metrics = Metrics(config)
        self.started = time.monotonic()
        self.chat_requests = 0
        self.corrupted = 0

    @property
    def max_total(self) -> int:
        return self.config.reported_max_total

    def ready(self) -> bool:
        return time.monotonic() - self.started >= self.config.startup_s

    async def health(self, request: web.Request) -> web.Response:
        if not self.ready():
            return web.Response(status=503, text="starting")
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.config.name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.config.model_path,
            "parent": None,
            "max_model_len": self.config.context_length or 131072,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.config.model_path,
                "tokenizer_path": self.config.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
            }
        )

    async def deprecated_server_info(self, request: web.Request) -> web.Response:
        # As the releases do (http_server.py `get_server_info`): a warning, then /server_info.
        log(
            "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
            "Please use '/server_info' instead."
        )
        return await self.server_info(request)

    async def server_info(self, request: web.Request) -> web.Response:
        info = self.config.server_info()
        info["engine_double"] = True
        info["internal_states"] = [
            {
                "num_running_reqs": self.load.running,
                "num_queue_reqs": self.load.queued,
                "chat_requests": self.chat_requests,
                "load": "observed"
                if self.config.observe_load
                else self.config.capped(self.config.load),
                "corrupted_responses": self.corrupted,
            }
        ]
        return web.json_response(info)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        if not self.config.enable_metrics:
            raise web.HTTPNotFound(text="metrics are off (start with --enable-metrics)")
        self.metrics.observe_load(
            self.load.running, self.load.queued, self.load.used_tokens, self.max_total
        )
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.load.running:
            return web.Response(status=400, text="Cache not flushed: requests are running.")
        return web.Response(text="Cache flushed.")

    @staticmethod
    def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
        return web.json_response(
            {"object": "error", "message": message, "type": kind, "param": None, "code": status},
            status=status,
        )

    def _kv_checksum_mismatch(self, body: dict[str, Any]) -> web.Response | None:
        """A transfer whose KV pages fail the checksum (the double's stand-in for upstream's
        SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB): aborted with HTTP 500, counted."""
        prob = self.config.kv_checksum_mismatch_prob
        if not self.config.kv_checksum or prob <= 0:
            return None
        draw = conversation_rng(self.config.seed, body, "kv-checksum")
        if draw.random() >= prob:
            return None
        room = draw.getrandbits(63)
        expected = draw.getrandbits(32)
        log(
            f"KV checksum mismatch req={draw.getrandbits(128):032x} bootstrap_room={room} "
            f"expected={expected:#x} got={expected ^ 1:#x}"
        )
        self.metrics.transfer_failed.labels(**self.metrics.sched).inc()
        return self._error(500, "KV checksum mismatch", "InternalServerError")

    def _bootstrap_failure(self, body: dict[str, Any]) -> web.Response | None:
        """A decode request whose PD bootstrap handshake fails (the double's stand-in for
        upstream's SGLANG_TEST_DISAGG_FAILURE_PROB): aborted with HTTP 500, counted."""
        prob = self.config.bootstrap_failure_prob
        if self.config.disaggregation_mode != "decode" or prob <= 0:
            return None
        draw = conversation_rng(self.config.seed, body, "bootstrap")
        if draw.random() >= prob:
            return None
        rid, room = f"{draw.getrandbits(128):032x}", draw.getrandbits(63)
        message = (
            f"Decode handshake failed for request rank=0 decode_req.req.rid='{rid}' "
            f"decode_req.req.bootstrap_room={room}"
        )
        log(message)
        self.metrics.bootstrap_failed.labels(**self.metrics.sched).inc()
        return self._error(500, message, "InternalServerError")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._error(400, "request body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return self._error(400, "messages must be a list")
        if not body["messages"]:
            return self._error(400, "messages must not be empty")
        declared: int | None = None
        if LOAD_HEADER in request.headers:
            try:
                declared = parse_load(
                    request.headers[LOAD_HEADER], LOAD_HEADER, allow_observed=False
                )
            except ValueError as error:
                return self._error(400, str(error))
        elif not self.config.observe_load:
            declared = self.config.load
        self.chat_requests += 1
        number = self.chat_requests
        oom_after = self.config.oom_after
        if oom_after is not None and self.chat_requests > oom_after:
            crash(self.config, f"at chat request {self.chat_requests}")
        rng = conversation_rng(self.config.seed, body)
        latency_rng = conversation_rng(self.config.seed, body, "latency")
        latency = self.config.latency_s * (0.75 + 0.5 * latency_rng.random())
        prompt_tokens = max(1, len(json.dumps(body["messages"], ensure_ascii=False)) // 4)
        limit = self.config.context_length
        if limit is not None and prompt_tokens > limit:  # as sglang's tokenizer manager
            return self._error(
                400,
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({limit} tokens).",
            )
        failed = self._bootstrap_failure(body) or self._kv_checksum_mismatch(body)
        if failed is not None:
            return failed
        began = time.monotonic()
        async with self.load.admit(prompt_tokens) as slot:
            self.metrics.observe_load(
                self.load.running, self.load.queued, self.load.used_tokens, self.max_total
            )
            if body.get("stream"):
                return await self._stream(
                    request, body, rng, slot, declared, latency, began, prompt_tokens, number
                )
            await asyncio.sleep(latency)
            load = self.config.capped(slot.peak if declared is None else declared)
            result = answer(self.config, body, rng, load, prompt_tokens, number)
            self._account(result, time.monotonic() - began, 0.4 * latency)
            self._parsed(body, result)
            return web.json_response(result.response, headers={LOAD_HEADER: str(result.load)})

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        rng: random.Random,
        slot: Slot,
        declared: int | None,
        latency: float,
        began: float,
        prompt_tokens: int,
        request_number: int,
    ) -> web.StreamResponse:
        ttft = 0.4 * latency
        await asyncio.sleep(ttft)
        load = self.config.capped(slot.peak if declared is None else declared)
        result = answer(self.config, body, rng, load, prompt_tokens, request_number)
        options = body.get("stream_options") or {}
        chunks = shapes.stream_chunks(
            result.response, rng, include_usage=bool(options.get("include_usage"))
        )
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                LOAD_HEADER: str(result.load),
            }
        )
        await response.prepare(request)
        gap = (latency - ttft) / max(1, len(chunks))
        try:
            for chunk in chunks:
                await response.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
                await asyncio.sleep(gap)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.metrics.aborted.labels(**self.metrics.model).inc()
            raise
        self._account(result, time.monotonic() - began, ttft)
        self._parsed(body, result)
        return response

    def _parsed(self, body: dict[str, Any], result: Answer) -> None:
        """What the release's tool-call parser logs and the image counts for this answer
        (streamed or not alike: the double does not model 0.5.16's streaming parser)."""
        if not parsers.offers_tools(body):
            return
        parsed = result.parsed
        for level, line in parsed.logs if parsed is not None else ():
            log(f"{level} {line}")
        if self.config.counts_tool_call_drops:
            self.metrics.count_tool_call_response(parsed.drop_reason if parsed else None)

    def _account(self, result: Answer, seconds: float, ttft: float) -> None:
        m = self.metrics
        usage = result.response["usage"]
        m.requests.labels(**m.model).inc()
        m.prompt_tokens.labels(**m.model).inc(usage["prompt_tokens"])
        m.generation_tokens.labels(**m.model).inc(usage["completion_tokens"])
        m.ttft.labels(**m.model).observe(ttft)
        m.e2e.labels(**m.model).observe(seconds)
        graph = (
            self.config.cuda_graph_max_bs is None or result.load <= self.config.cuda_graph_max_bs
        )
        mode = "decode_cuda_graph" if graph else "decode_none"
        m.graph_passes.labels(**m.sched, mode=mode).inc(usage["completion_tokens"])
        m.gen_throughput.labels(**m.sched).set(usage["completion_tokens"] / max(seconds, 1e-6))
        if m.load_back is not None:
            m.load_back.labels(**m.model).inc(usage["prompt_tokens"] // 2)
        if result.shape is not None:
            self.corrupted += 1


async def _ok(request: web.Request) -> web.Response:
    return web.Response(status=200)


def build_app(config: DoubleConfig) -> web.Application:
    """The aiohttp application of one engine double."""
    double = EngineDouble(config)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app["double"] = double
    if config.node_rank >= 1:  # a group's worker: sglang's launch_dummy_health_check_server
        for path in ("/health", "/health_generate", "/ping"):
            app.router.add_get(path, _ok)
        app.router.add_get("/metrics", double.metrics_endpoint)
        return app
    app.router.add_get("/health", double.health)
    app.router.add_get("/health_generate", double.health)
    app.router.add_get("/v1/models", double.models)
    app.router.add_get("/get_model_info", double.model_info)
    app.router.add_get("/get_server_info", double.deprecated_server_info)
    app.router.add_get("/server_info", double.server_info)
    app.router.add_get("/metrics", double.metrics_endpoint)
    app.router.add_route("*", "/flush_cache", double.flush_cache)
    app.router.add_post("/v1/chat/completions", double.chat)
    return app


async def serve(config: DoubleConfig) -> None:
    log(f"server_args={json.dumps(config.server_info(), sort_keys=True)}")
    log(
        "engine double (a test double standing in for SGLang; no GPU): "
        f"sglang={config.sglang_version} index_k={config.index_k_dtype} "
        f"hicache={config.enable_hierarchical_cache} "
        f"multi_stream={config.multi_stream_overlap} capabilities={sorted(config.capabilities)} "
        f"faults={list(config.faults) or 'none'} "
        + (
            "load=observed (NON-DETERMINISTIC: follows the requests actually in flight)"
            if config.observe_load
            else f"load={config.capped(config.load)} (declared; X-DSV4-Double-Load overrides)"
        )
    )
    if config.bf16_index_k_requested and config.index_k_dtype != "bf16":
        log("SGLANG_DSV4_BF16_INDEX_K=1 is ignored: this image has no bf16IndexK capability")
    if config.unknown_args:
        log(f"engine double: ignoring flags it does not model: {' '.join(config.unknown_args)}")
    if config.oom_after == 0:
        crash(config, "during CUDA graph capture")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if config.loading_s > 0:  # sglang opens its port once every scheduler has loaded
        log("Load weight begin. (engine double: the port stays closed until the end)")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), config.loading_s)
        if stop.is_set():
            log("engine double: shutting down")
            return
        log("Load weight end.")
    app = build_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1]
    log(f"Uvicorn running on http://{config.host}:{port} (Press CTRL+C to quit)")
    if config.startup_s > 0 and config.node_rank == 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), config.startup_s)
    if not stop.is_set():
        log("The server is fired up and ready to roll!")
        await stop.wait()
    log("engine double: shutting down")
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_config(sys.argv[1:] if argv is None else argv)
    asyncio.run(serve(config))

"""The canary harness: N concurrent tool-calling sessions x R rounds, every response classified."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from dsv4_operator.canary.report import CanaryReport, ResponseRecord, SessionResult
from dsv4_operator.canary.scenario import CANARY_TOOLS, fake_result, first_messages, session_steps
from dsv4_operator.canary.transport import (
    Exchanges,
    discover_model,
    exchanges,
    normalise_base_url,
    send,
)
from dsv4_operator.leak.classifier import classify_response
from dsv4_operator.leak.verdict import VerdictKind

DEFAULT_TEMPERATURE = 0.6
DEFAULT_MAX_TOKENS = 512


async def _session(
    index: int,
    *,
    client: Exchanges,
    url: str,
    model: str,
    rounds: int,
    timeout: float,
    seed: int,
    stream: bool,
    gate: asyncio.Semaphore,
    tools: Sequence[Mapping[str, Any]],
    request_extra: Mapping[str, Any],
    record: Callable[[ResponseRecord], None],
) -> SessionResult:
    steps = session_steps(seed, index, rounds)
    messages = first_messages(seed, index, steps)
    rng = random.Random(f"results:{seed}:{index}")
    verdicts: list[VerdictKind] = []
    for round_ in range(1, rounds + 1):
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "tools": list(tools),
            "tool_choice": "auto",
            "stream": stream,
            **request_extra,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        async with gate:
            sent = await send(client, url, body, timeout, stream)
        if sent.verdict is not None:
            verdict = sent.verdict
        else:
            assert sent.body is not None
            verdict = classify_response(sent.body, tools=tools, must_call=True)
        record(ResponseRecord(index, round_, verdict, sent.latency_s, sent.status, sent.attempts))
        verdicts.append(verdict.kind)
        if verdict.kind is not VerdictKind.OK or round_ == rounds:
            break
        assert sent.body is not None
        message = sent.body["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        messages = [
            *messages,
            {
                "role": "assistant",
                "content": message.get("content"),
                "tool_calls": calls,
            },
        ]
        for call in calls:
            arguments = json.loads(call["function"]["arguments"])
            result = fake_result(call["function"]["name"], arguments, rng, round_, steps)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.get("id") or f"call_{index}_{round_}",
                    "content": json.dumps(result),
                }
            )
    return SessionResult(index, tuple(verdicts), rounds)


async def run_canary(
    client: httpx.AsyncClient | Exchanges,
    base_url: str,
    model: str | None = None,
    sessions: int = 8,
    rounds: int = 4,
    concurrency: int | None = None,
    timeout: float = 60.0,
    seed: int = 0,
    *,
    stream: bool = False,
    confidence: float = 0.99,
    temperature: float = DEFAULT_TEMPERATURE,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    tools: Sequence[Mapping[str, Any]] = CANARY_TOOLS,
    on_response: Callable[[ResponseRecord], None] | None = None,
) -> CanaryReport:
    """Run `sessions` concurrent tool-calling conversations of `rounds` rounds each.

    `client`: an httpx client, or the guard's `Exchanges`. `base_url` is the server root
    (`/v1` suffix accepted); `model` None asks `/v1/models` (raising `EndpointUnreachable` /
    `EndpointError`). At most `concurrency` requests are in
    flight (default: one per session); `timeout` bounds each request in seconds. The same
    `seed` gives the same prompts and fake tool results. `on_response` is called after every
    round (progress bars). Transport and HTTP failures become `error` verdicts, never raise.
    """
    if sessions < 1 or rounds < 1:
        raise ValueError(f"sessions and rounds must be >= 1, got {sessions} x {rounds}")
    concurrency = sessions if concurrency is None else concurrency
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0, got {timeout}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    base = normalise_base_url(base_url)
    client = exchanges(client)
    if model is None:
        model = await discover_model(client, base, timeout=min(timeout, 10.0))
    gate = asyncio.Semaphore(concurrency)
    records: list[ResponseRecord] = []

    def record(item: ResponseRecord) -> None:
        records.append(item)
        if on_response is not None:
            on_response(item)

    began = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(
                _session(
                    index,
                    client=client,
                    url=f"{base}/v1/chat/completions",
                    model=model,
                    rounds=rounds,
                    timeout=timeout,
                    seed=seed,
                    stream=stream,
                    gate=gate,
                    tools=tools,
                    request_extra={"temperature": temperature, "max_tokens": max_tokens},
                    record=record,
                )
            )
            for index in range(sessions)
        ]
    duration = time.perf_counter() - began
    records.sort(key=lambda r: (r.session, r.round))
    return CanaryReport(
        base_url=base,
        model=model,
        sessions=sessions,
        rounds=rounds,
        concurrency=concurrency,
        seed=seed,
        stream=stream,
        confidence=confidence,
        duration_s=duration,
        records=tuple(records),
        session_results=tuple(t.result() for t in tasks),
    )

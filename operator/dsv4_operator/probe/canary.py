"""Multi-turn tool-calling canary: N concurrent sessions x R rounds, every response classified.

Like the seeds' 60x4 / 80x6 repro harness: each session is an agent conversation whose every
round must call one of three tools (`get_weather`, `search_docs`, `run_sql`, with JSON
schemas). The first round's user message lists R steps; after each tool call the harness
appends the assistant message and a fake tool result (which names the next step) and sends the
conversation again. A round whose response is not `ok` ends its session: a corrupted turn has
no tool call to answer, so the conversation cannot go on (as in the seeds' harness).

I/O goes through an injected `httpx.AsyncClient` (the seam for tests and for the guard
daemon). Requests are bounded by a semaphore (`concurrency`), each has a total `timeout`
(waiting for the semaphore excluded), and only connection failures before the request was
sent (connect errors/timeouts, pool timeouts) are retried; a response that came back, or a
request that may have reached the server, is never retried.

Two leak rates are reported. Per response: leaks / classified responses (error verdicts are
excluded: they are not evidence about corruption). Per session: sessions with a leak / sessions
that leaked or completed every round; sessions are the independent unit (rounds of one
conversation share its context), which is what the seeds' "17% of sessions" counts.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from dsv4_operator.probe.dsml import (
    LEAK_KINDS,
    StreamError,
    Verdict,
    VerdictKind,
    assemble_stream,
    classify,
)
from dsv4_operator.probe.stats import percentile, wilson_interval

Per = Literal["sessions", "responses"]
MAX_ATTEMPTS = 3
RETRY_BACKOFF_S = (0.2, 0.5)
DEFAULT_TEMPERATURE = 0.6
DEFAULT_MAX_TOKENS = 512
EXAMPLES = 5

CANARY_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "City name, e.g. Hangzhou"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the internal documentation; returns the best passages.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1},
                    "top_k": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_sql",
            "description": "Run a read-only SQL query against an analytics database.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1},
                    "database": {"type": "string", "enum": ["analytics", "billing", "ops"]},
                },
                "required": ["query", "database"],
                "additionalProperties": False,
            },
        },
    },
]

SYSTEM_PROMPT = (
    "You are an operations agent. You act only through the tools provided. Every turn must be "
    "exactly one tool call for the next step of the task; do not answer in prose until every "
    "step is done."
)
_CITIES = ["Hangzhou", "Paris", "Lagos", "Osaka", "Lima", "Oslo", "Pune", "Quito", "Tunis", "Perth"]
_TOPICS = ["HiCache eviction", "bootstrap port", "PD disaggregation", "CUDA graph capture",
           "tool call parser", "KV cache dtype", "cache-aware routing"]  # fmt: skip
_QUERIES = [
    ("count yesterday's orders by region", "analytics"),
    ("list the ten largest unpaid invoices", "billing"),
    ("find services with p99 latency above one second", "ops"),
    ("sum shipped quantity per SKU this week", "analytics"),
]


class ProbeError(Exception):
    """Base of the canary's own errors."""


class EndpointUnreachable(ProbeError):
    """Nothing answered at the base URL (connection refused, DNS, connect timeout)."""


class EndpointError(ProbeError):
    """The endpoint answered, but not like an OpenAI-compatible server."""


# --- results --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResponseRecord:
    """One round of one session: its verdict and how the request went."""

    session: int
    round: int
    verdict: Verdict
    latency_s: float | None  # None when no response came back
    status: int | None  # HTTP status, None when there was none
    attempts: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "round": self.round,
            **self.verdict.as_dict(),
            "latency_s": self.latency_s,
            "status": self.status,
            "attempts": self.attempts,
        }


@dataclass(frozen=True)
class SessionResult:
    """The verdicts of one session's rounds, in order (it stops at the first non-ok)."""

    index: int
    verdicts: tuple[VerdictKind, ...]
    rounds: int

    @property
    def leaked(self) -> bool:
        return any(v in LEAK_KINDS for v in self.verdicts)

    @property
    def completed(self) -> bool:
        return len(self.verdicts) == self.rounds and all(v is VerdictKind.OK for v in self.verdicts)

    @property
    def outcome(self) -> Literal["clean", "leaked", "incomplete"]:
        """`incomplete`: an error verdict ended the session before any leak."""
        if self.leaked:
            return "leaked"
        return "clean" if self.completed else "incomplete"

    def as_dict(self) -> dict[str, Any]:
        return {
            "session": self.index,
            "outcome": self.outcome,
            "verdicts": [v.value for v in self.verdicts],
        }


@dataclass(frozen=True)
class CanaryReport:
    """Everything one canary run observed; rates and intervals are derived from the records."""

    base_url: str
    model: str
    sessions: int
    rounds: int
    concurrency: int
    seed: int
    stream: bool
    confidence: float
    duration_s: float
    records: tuple[ResponseRecord, ...]
    session_results: tuple[SessionResult, ...]
    counts: dict[VerdictKind, int] = field(init=False)

    def __post_init__(self) -> None:
        counts = dict.fromkeys(VerdictKind, 0)
        for record in self.records:
            counts[record.verdict.kind] += 1
        object.__setattr__(self, "counts", counts)

    @property
    def responses(self) -> int:
        """Rounds sent, errors included."""
        return len(self.records)

    @property
    def errors(self) -> int:
        return self.counts[VerdictKind.ERROR]

    @property
    def classified(self) -> int:
        """Responses that came back and were classified (the per-response denominator)."""
        return self.responses - self.errors

    @property
    def leaks(self) -> int:
        return sum(self.counts[k] for k in LEAK_KINDS)

    @property
    def leak_rate(self) -> float:
        """Per-response leak rate (0 with no classified response)."""
        return self.leaks / self.classified if self.classified else 0.0

    @property
    def leak_interval(self) -> tuple[float, float]:
        return wilson_interval(self.leaks, self.classified, self.confidence)

    @property
    def session_leaks(self) -> int:
        return sum(1 for s in self.session_results if s.leaked)

    @property
    def sessions_observed(self) -> int:
        """Sessions that leaked or completed every round (the per-session denominator)."""
        return sum(1 for s in self.session_results if s.outcome != "incomplete")

    @property
    def session_leak_rate(self) -> float:
        observed = self.sessions_observed
        return self.session_leaks / observed if observed else 0.0

    @property
    def session_leak_interval(self) -> tuple[float, float]:
        return wilson_interval(self.session_leaks, self.sessions_observed, self.confidence)

    def rate(self, per: Per) -> tuple[int, int, float, tuple[float, float]]:
        """(leaks, trials, rate, Wilson interval) per session or per response."""
        if per == "sessions":
            return (
                self.session_leaks,
                self.sessions_observed,
                self.session_leak_rate,
                self.session_leak_interval,
            )
        return self.leaks, self.classified, self.leak_rate, self.leak_interval

    def latency(self, q: float) -> float | None:
        """Latency percentile in seconds over responses that came back with HTTP 200."""
        values = [r.latency_s for r in self.records if r.latency_s is not None and r.status == 200]
        return percentile(values, q)

    @property
    def latency_p50(self) -> float | None:
        return self.latency(50)

    @property
    def latency_p95(self) -> float | None:
        return self.latency(95)

    @property
    def latency_p99(self) -> float | None:
        return self.latency(99)

    @property
    def examples(self) -> list[ResponseRecord]:
        """Up to five leaked responses, one per verdict kind first."""
        leaks = [r for r in self.records if r.verdict.leak]
        chosen: list[ResponseRecord] = []
        seen: set[VerdictKind] = set()
        for record in leaks:
            if record.verdict.kind not in seen:
                chosen.append(record)
                seen.add(record.verdict.kind)
        chosen += [r for r in leaks if r not in chosen]
        return chosen[:EXAMPLES]

    @property
    def error_examples(self) -> list[ResponseRecord]:
        return [r for r in self.records if r.verdict.kind is VerdictKind.ERROR][:EXAMPLES]

    def as_dict(self) -> dict[str, Any]:
        def rate(per: Per) -> dict[str, Any]:
            leaks, trials, value, (low, high) = self.rate(per)
            return {"leaks": leaks, "of": trials, "rate": value, "interval": [low, high]}

        return {
            "url": self.base_url,
            "model": self.model,
            "sessions": self.sessions,
            "rounds": self.rounds,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "stream": self.stream,
            "confidence": self.confidence,
            "duration_s": round(self.duration_s, 3),
            "responses": self.responses,
            "counts": {k.value: v for k, v in self.counts.items()},
            "response_leak_rate": rate("responses"),
            "session_leak_rate": rate("sessions"),
            "latency_s": {
                "p50": self.latency_p50,
                "p95": self.latency_p95,
                "p99": self.latency_p99,
            },
            "examples": [r.as_dict() for r in self.examples],
            "error_examples": [r.as_dict() for r in self.error_examples],
            "session_results": [s.as_dict() for s in self.session_results],
        }


# --- prompts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    tool: str
    text: str


def session_steps(seed: int, session: int, rounds: int) -> list[Step]:
    """The R steps of one session: a function of (seed, session) only, so `--vs` is paired."""
    rng = random.Random(f"{seed}:{session}")
    steps: list[Step] = []
    for _ in range(rounds):
        tool = rng.choice(["get_weather", "search_docs", "run_sql"])
        if tool == "get_weather":
            text = f"check the current weather in {rng.choice(_CITIES)}"
        elif tool == "search_docs":
            text = f"search the docs for '{rng.choice(_TOPICS)}'"
        else:
            purpose, database = rng.choice(_QUERIES)
            text = f"run SQL on the {database} database to {purpose}"
        steps.append(Step(tool, text))
    return steps


def first_messages(seed: int, session: int, steps: Sequence[Step]) -> list[dict[str, Any]]:
    listed = " ".join(f"Step {i}: {s.text}." for i, s in enumerate(steps, 1))
    user = (
        f"Session {session} (canary seed {seed}). I need a short operations report. {listed} "
        "Do one step per turn, each with exactly one tool call."
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def fake_result(
    name: str, arguments: Mapping[str, Any], rng: random.Random, step: int, steps: Sequence[Step]
) -> dict[str, Any]:
    """A plausible tool result, naming the next step so every round calls a tool."""
    result: dict[str, Any]
    if name == "get_weather":
        result = {
            "location": arguments.get("location", "unknown"),
            "temperature_c": rng.randint(-5, 35),
            "conditions": rng.choice(["clear", "cloudy", "light rain", "windy"]),
        }
    elif name == "search_docs":
        result = {
            "results": [
                {
                    "title": f"{arguments.get('query', 'docs')}: section {i}",
                    "passage": "The operator renders one engine configuration for both roles, "
                    "so prefill and decode always agree on the transfer format.",
                }
                for i in range(1, 3)
            ]
        }
    else:
        result = {
            "columns": ["key", "value"],
            "rows": [[f"k{i}", rng.randint(1, 1000)] for i in range(3)],
            "row_count": 3,
        }
    if step < len(steps):
        result["status"] = f"step {step} of {len(steps)} done; next: step {step + 1}"
        result["next_step"] = steps[step].text
    else:
        result["status"] = f"step {step} of {len(steps)} done; all steps done"
    return result


# --- transport ------------------------------------------------------------------------------


def normalise_base_url(url: str) -> str:
    """`http://h:8000`, `http://h:8000/` and `http://h:8000/v1` all mean the same server."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


async def discover_model(client: httpx.AsyncClient, base_url: str, timeout: float = 10.0) -> str:
    """The first model id served at `base_url` (`GET /v1/models`); typed failures."""
    url = f"{normalise_base_url(base_url)}/v1/models"
    try:
        response = await client.get(url, timeout=timeout)
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:
        detail = str(error) or type(error).__name__
        raise EndpointUnreachable(f"cannot connect to {url}: {detail}") from error
    except httpx.HTTPError as error:
        raise EndpointError(f"GET {url} failed: {type(error).__name__}: {error}") from error
    if response.status_code != 200:
        raise EndpointError(f"GET {url} answered HTTP {response.status_code}")
    try:
        data = response.json()["data"]
        return str(data[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise EndpointError(f"GET {url} did not list a model: {response.text[:200]!r}") from error


@dataclass(frozen=True)
class _Outcome:
    verdict: Verdict | None  # set for errors; None when `body` is to be classified
    body: Mapping[str, Any] | None
    status: int | None
    latency_s: float | None
    attempts: int


_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


async def _send(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout: float, stream: bool
) -> _Outcome:
    """POST once (retrying only failures before the request was sent) and read the body."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        began = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                if stream:
                    async with client.stream("POST", url, json=body, timeout=timeout) as reply:
                        if reply.status_code != 200:
                            text = (await reply.aread()).decode("utf-8", "replace")
                            return _http_error(reply.status_code, text, began, attempt)
                        lines = [line async for line in reply.aiter_lines()]
                    parsed: Any = assemble_stream(lines)
                    status = 200
                else:
                    reply = await client.post(url, json=body, timeout=timeout)
                    if reply.status_code != 200:
                        return _http_error(reply.status_code, reply.text, began, attempt)
                    status = reply.status_code
                    parsed = reply.json()
        except _RETRYABLE as error:
            if attempt < MAX_ATTEMPTS:
                await asyncio.sleep(RETRY_BACKOFF_S[min(attempt - 1, len(RETRY_BACKOFF_S) - 1)])
                continue
            reason = f"cannot connect after {attempt} attempts: {type(error).__name__}"
            return _Outcome(Verdict.error(reason, str(error)), None, None, None, attempt)
        except (TimeoutError, httpx.TimeoutException):
            return _Outcome(Verdict.error(f"timeout after {timeout:g}s"), None, None, None, attempt)
        except httpx.HTTPError as error:
            reason = f"transport error: {type(error).__name__}"
            return _Outcome(Verdict.error(reason, str(error)), None, None, None, attempt)
        except StreamError as error:
            elapsed = time.perf_counter() - began
            return _Outcome(Verdict.error("broken stream", str(error)), None, 200, elapsed, attempt)
        except ValueError as error:  # a 200 whose body is not JSON
            elapsed = time.perf_counter() - began
            return _Outcome(
                Verdict.error("response body is not JSON", str(error)), None, 200, elapsed, attempt
            )
        elapsed = time.perf_counter() - began
        if not isinstance(parsed, Mapping):
            verdict = Verdict.error("response body is not a JSON object", str(parsed)[:200])
            return _Outcome(verdict, None, status, elapsed, attempt)
        return _Outcome(None, parsed, status, elapsed, attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def _http_error(status: int, text: str, began: float, attempt: int) -> _Outcome:
    verdict = Verdict.error(f"HTTP {status}", text)
    return _Outcome(verdict, None, status, time.perf_counter() - began, attempt)


# --- harness --------------------------------------------------------------------------------


async def _session(
    index: int,
    *,
    client: httpx.AsyncClient,
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
            outcome = await _send(client, url, body, timeout, stream)
        if outcome.verdict is not None:
            verdict = outcome.verdict
        else:
            assert outcome.body is not None
            verdict = classify(outcome.body, tools=tools, must_call=True)
        record(
            ResponseRecord(
                index, round_, verdict, outcome.latency_s, outcome.status, outcome.attempts
            )
        )
        verdicts.append(verdict.kind)
        if verdict.kind is not VerdictKind.OK or round_ == rounds:
            break
        assert outcome.body is not None
        message = outcome.body["choices"][0]["message"]
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
    client: httpx.AsyncClient,
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

    `base_url` is the server root (`/v1` suffix accepted); `model` None asks `/v1/models`
    (raising `EndpointUnreachable` / `EndpointError`). At most `concurrency` requests are in
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

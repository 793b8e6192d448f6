"""The canary's HTTP side: model discovery and one chat request, failures made verdicts.

I/O goes through an injected `Exchanges` (one request, the whole reply read): an
`httpx.AsyncClient` adapted (the CLI, tests' mock transports), or the guard's own on aiohttp's
connections (signals/http.py), which costs less than half the CPU per request. Requests are
bounded by a semaphore (`concurrency`), each has a total `timeout` (waiting for the semaphore
excluded), and only connection failures before the request was sent (connect errors/timeouts,
pool timeouts) are retried; a response that came back, or a request that may have reached the
server, is never retried.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from dsv4_operator.leak.sse import StreamError, assemble_stream
from dsv4_operator.leak.verdict import Verdict
from dsv4_operator.names import PROBE_HEADER

MAX_ATTEMPTS = 3
RETRY_BACKOFF_S = (0.2, 0.5)
# How long an idle connection is kept for the canary's next request: well under the engine's
# own keep-alive (SGLang's uvicorn, `SGLANG_TIMEOUT_KEEP_ALIVE`, 5 s by default), so that no
# request goes out on a connection the engine is closing. Such a POST fails once sent (aiohttp
# retries only idempotent methods on a kept connection, httpx none) and counts as an `error`.
KEEPALIVE_S = 2.0


def canary_limits(connections: int) -> httpx.Limits:
    """An httpx client's limits for a canary of `connections` requests at once.

    Few idle connections kept: httpcore 1.0.9 assigns pooled connections to queued requests in
    O(connections x requests) per pass (encode/httpcore#1035), which stalls the event loop for
    seconds at 60+ concurrent requests with a large idle pool."""
    return httpx.Limits(
        max_connections=connections + 4, max_keepalive_connections=8, keepalive_expiry=KEEPALIVE_S
    )


class ProbeError(Exception):
    """Base of the canary's own errors."""


class EndpointUnreachable(ProbeError):
    """Nothing answered at the base URL (connection refused, DNS, connect timeout)."""


class EndpointError(ProbeError):
    """The endpoint answered, but not like an OpenAI-compatible server."""


class Exchanges(Protocol):
    """One HTTP exchange: the reply's status and its whole body, or an `httpx.HTTPError`
    (`ConnectError`, `ConnectTimeout` and `PoolTimeout` only before the request was sent)."""

    async def exchange(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str], timeout: float
    ) -> tuple[int, bytes]: ...


@dataclass(frozen=True)
class HttpxExchanges:
    """Exchanges on an httpx client, with its headers, limits and transport."""

    client: httpx.AsyncClient

    async def exchange(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str], timeout: float
    ) -> tuple[int, bytes]:
        reply = await self.client.request(
            method, url, content=body, headers=dict(headers), timeout=timeout
        )
        return reply.status_code, reply.content


def exchanges(client: httpx.AsyncClient | Exchanges) -> Exchanges:
    """`client` as Exchanges: an httpx client adapted, anything else as it is."""
    return HttpxExchanges(client) if isinstance(client, httpx.AsyncClient) else client


JSON_BODY = {**PROBE_HEADER, "Content-Type": "application/json"}


def normalise_base_url(url: str) -> str:
    """`http://h:8000`, `http://h:8000/` and `http://h:8000/v1` all mean the same server."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


async def discover_model(
    client: httpx.AsyncClient | Exchanges, base_url: str, timeout: float = 10.0
) -> str:
    """The first model id served at `base_url` (`GET /v1/models`); typed failures."""
    url = f"{normalise_base_url(base_url)}/v1/models"
    try:
        status, content = await exchanges(client).exchange("GET", url, None, {}, timeout)
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:
        detail = str(error) or type(error).__name__
        raise EndpointUnreachable(f"cannot connect to {url}: {detail}") from error
    except httpx.HTTPError as error:
        raise EndpointError(f"GET {url} failed: {type(error).__name__}: {error}") from error
    if status != 200:
        raise EndpointError(f"GET {url} answered HTTP {status}")
    try:
        data = json.loads(content)["data"]
        return str(data[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as error:
        text = content.decode("utf-8", "replace")
        raise EndpointError(f"GET {url} did not list a model: {text[:200]!r}") from error


@dataclass(frozen=True)
class SendResult:
    """What one `send` brought back: an error verdict, or a body to classify."""

    verdict: Verdict | None  # set for errors; None when `body` is to be classified
    body: Mapping[str, Any] | None
    status: int | None
    latency_s: float | None
    attempts: int


# Retried here rather than by `httpx.AsyncHTTPTransport(retries=N)`: the client is the caller's
# (the CLI, the guard's canary runner, tests), a transport's retries are invisible to the harness (a
# record counts its `attempts`), and they would not cover a pool timeout.
_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


async def send(
    client: httpx.AsyncClient | Exchanges,
    url: str,
    body: dict[str, Any],
    timeout: float,
    stream: bool,
) -> SendResult:
    """POST once (retrying only failures before the request was sent) and read the body."""
    poster = exchanges(client)
    # As httpx encodes `json=`: compact, raw UTF-8, no NaN.
    content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    encoded = content.encode()
    for attempt in range(1, MAX_ATTEMPTS + 1):
        began = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                status, raw = await poster.exchange("POST", url, encoded, JSON_BODY, timeout)
            if status != 200:
                return _http_error(status, raw.decode("utf-8", "replace"), began, attempt)
            # A stream is split by SSE's own line ends (leak/sse.py): a line splitter such
            # as httpx's `aiter_lines` also splits at U+2028/U+0085, which JSON leaves raw.
            parsed: Any = assemble_stream(raw) if stream else json.loads(raw)
        except _RETRYABLE as error:
            if attempt < MAX_ATTEMPTS:
                await asyncio.sleep(RETRY_BACKOFF_S[min(attempt - 1, len(RETRY_BACKOFF_S) - 1)])
                continue
            reason = f"cannot connect after {attempt} attempts: {type(error).__name__}"
            return SendResult(Verdict.error(reason, str(error)), None, None, None, attempt)
        except (TimeoutError, httpx.TimeoutException):
            return SendResult(
                Verdict.error(f"timeout after {timeout:g}s"), None, None, None, attempt
            )
        except httpx.HTTPError as error:
            reason = f"transport error: {type(error).__name__}"
            return SendResult(Verdict.error(reason, str(error)), None, None, None, attempt)
        except StreamError as error:
            elapsed = time.perf_counter() - began
            return SendResult(
                Verdict.error("broken stream", str(error)), None, 200, elapsed, attempt
            )
        except ValueError as error:  # a 200 whose body is not JSON
            elapsed = time.perf_counter() - began
            return SendResult(
                Verdict.error("response body is not JSON", str(error)), None, 200, elapsed, attempt
            )
        elapsed = time.perf_counter() - began
        if not isinstance(parsed, Mapping):
            verdict = Verdict.error("response body is not a JSON object", str(parsed)[:200])
            return SendResult(verdict, None, status, elapsed, attempt)
        return SendResult(None, parsed, status, elapsed, attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def _http_error(status: int, text: str, began: float, attempt: int) -> SendResult:
    verdict = Verdict.error(f"HTTP {status}", text)
    return SendResult(verdict, None, status, time.perf_counter() - began, attempt)

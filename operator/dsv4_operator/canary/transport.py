"""The canary's HTTP side: model discovery and one chat request, failures made verdicts.

I/O goes through an injected `httpx.AsyncClient` (the seam for tests and for the guard
daemon). Requests are bounded by a semaphore (`concurrency`), each has a total `timeout`
(waiting for the semaphore excluded), and only connection failures before the request was
sent (connect errors/timeouts, pool timeouts) are retried; a response that came back, or a
request that may have reached the server, is never retried.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from dsv4_operator.leak.sse import StreamError, assemble_stream
from dsv4_operator.leak.verdict import Verdict
from dsv4_operator.names import PROBE_HEADER

MAX_ATTEMPTS = 3
RETRY_BACKOFF_S = (0.2, 0.5)


class ProbeError(Exception):
    """Base of the canary's own errors."""


class EndpointUnreachable(ProbeError):
    """Nothing answered at the base URL (connection refused, DNS, connect timeout)."""


class EndpointError(ProbeError):
    """The endpoint answered, but not like an OpenAI-compatible server."""


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
    client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout: float, stream: bool
) -> SendResult:
    """POST once (retrying only failures before the request was sent) and read the body."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        began = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                if stream:
                    async with client.stream(
                        "POST", url, json=body, headers=PROBE_HEADER, timeout=timeout
                    ) as reply:
                        if reply.status_code != 200:
                            text = (await reply.aread()).decode("utf-8", "replace")
                            return _http_error(reply.status_code, text, began, attempt)
                        # The whole body, split by SSE's own line ends: httpx's
                        # `aiter_lines` also splits at U+2028/U+0085, which JSON leaves raw.
                        raw = await reply.aread()
                    parsed: Any = assemble_stream(raw)
                    status = 200
                else:
                    reply = await client.post(url, json=body, headers=PROBE_HEADER, timeout=timeout)
                    if reply.status_code != 200:
                        return _http_error(reply.status_code, reply.text, began, attempt)
                    status = reply.status_code
                    parsed = reply.json()
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

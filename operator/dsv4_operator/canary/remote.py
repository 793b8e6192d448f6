"""A canary run one process asks of another: the guard asks a router pod's leak tap to run it
against the router beside it (`POST /canary` on the tap's metrics port), and gets counts back.

Why: a run is tens of requests, each a few hundred microseconds of Python CPU in whoever sends
it; run by the operator that is most of its idle CPU at fleet scale (docs/guard.md, "Where the
canary runs"). Run by the tap, the operator's part is one request per run. Both sides import
this module, so the wire format has one definition.

    POST /canary   {"model": "deepseek-v4", "sessions": 9, "rounds": 4}
    200            {"counts": {"ok": 36}, "firstError": null}
    400            a body that is not such an object (the message names the field)
    429            as many runs as the tap allows are in progress (`--canary-runs-at-once`)
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dsv4_operator.api.limits import MAX_CANARY_ROUNDS, MAX_CANARY_SESSIONS
from dsv4_operator.canary.report import CanaryReport
from dsv4_operator.canary.transport import Exchanges
from dsv4_operator.leak.verdict import VerdictKind

CANARY_PATH = "/canary"
# Each request of a run has this long (run_canary's default); a run's rounds are sequential.
REQUEST_TIMEOUT_S = 60.0
JSON_HEADERS = {"Content-Type": "application/json"}


class RunRequest(BaseModel):
    """What the guard asks of the tap: the served model, sessions and rounds (the spec's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, max_length=256)
    sessions: int = Field(ge=1, le=MAX_CANARY_SESSIONS)
    rounds: int = Field(ge=1, le=MAX_CANARY_ROUNDS)

    def timeout(self) -> float:
        """How long the whole run may take: its rounds one after another, plus a margin."""
        return self.rounds * REQUEST_TIMEOUT_S + 30.0


@dataclass(frozen=True)
class RunCounts:
    """What one canary run saw: verdict counts, and why its first failed request failed (the
    reason only, such as `HTTP 503` or `cannot connect after 3 attempts: ConnectError`: never
    the reply's text, since status is readable by anyone who can read the object)."""

    counts: dict[str, int]
    first_error: str | None = None

    @classmethod
    def of(cls, report: CanaryReport) -> RunCounts:
        failed = (r.verdict.reason for r in report.records if r.verdict.kind == VerdictKind.ERROR)
        return cls({str(k): int(v) for k, v in report.counts.items()}, next(failed, None))

    def to_wire(self) -> dict[str, Any]:
        return {"counts": self.counts, "firstError": self.first_error}

    @classmethod
    def from_wire(cls, body: Any) -> RunCounts:
        """ValueError unless `body` is what `to_wire` makes."""
        if not isinstance(body, Mapping):
            raise ValueError("not a JSON object")
        counts, first = body.get("counts"), body.get("firstError")
        if not isinstance(counts, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in counts.items()
        ):
            raise ValueError("counts: expected an object of verdict -> count")
        if first is not None and not isinstance(first, str):
            raise ValueError("firstError: expected a string or null")
        return cls(dict(counts), first)


class Poster(Protocol):
    """A client that bounds connecting apart from waiting (signals/http.py AiohttpExchanges)."""

    async def exchange(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
        *,
        connect: float | None = None,
    ) -> tuple[int, bytes]: ...


class TapCanaryUnavailable(Exception):
    """The tap did not run the canary (unreachable, an older tap without /canary, busy, or a
    reply that is not a run's counts): the caller runs it itself."""


class TapCanaryTimedOut(Exception):
    """The tap took the run and did not answer in time: the router it probes is that slow, so
    this is a failed run (the caller counts it so), not one to repeat from elsewhere."""


async def run_on_tap(
    client: Poster, tap_url: str, request: RunRequest, connect_timeout: float = 2.0
) -> RunCounts:
    """Ask the tap at `tap_url` (http://pod-ip:port) to run the canary; TapCanaryUnavailable
    when it did not, TapCanaryTimedOut when it took the run and did not answer in time."""
    body = request.model_dump_json().encode()
    timeout = request.timeout()
    try:
        async with asyncio.timeout(timeout):
            status, raw = await client.exchange(
                "POST", tap_url + CANARY_PATH, body, JSON_HEADERS, timeout, connect=connect_timeout
            )
    except (httpx.ReadTimeout, TimeoutError) as error:  # connected and asked: the run's time
        raise TapCanaryTimedOut(f"no answer within {timeout:.0f} s") from error
    except httpx.HTTPError as error:
        raise TapCanaryUnavailable(f"{type(error).__name__}") from error
    if status != 200:
        raise TapCanaryUnavailable(f"HTTP {status}")
    try:
        return RunCounts.from_wire(json.loads(raw))
    except ValueError as error:
        raise TapCanaryUnavailable(f"not a canary run's counts: {error}") from error


class CanaryService:
    """The tap's side: runs asked for by the guard, against `upstream` (the router), at most
    `at_once` at a time. `client` is the tap's own, kept for its life."""

    def __init__(self, upstream: str, client: Exchanges, at_once: int = 1) -> None:
        self.upstream, self.client, self.at_once = upstream, client, at_once
        self.running = 0

    async def handle(self, request: web.Request) -> web.Response:
        try:
            asked = RunRequest.model_validate_json(await request.read())
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in error.errors()
            )
            return web.json_response({"error": problems}, status=400)
        if self.running >= self.at_once:
            return web.json_response(
                {"error": f"{self.running} canary run(s) in progress, the most this tap runs"},
                status=429,
            )
        self.running += 1
        try:
            counts = await self.run(asked)
        finally:
            self.running -= 1
        return web.json_response(counts.to_wire())

    async def run(self, asked: RunRequest) -> RunCounts:
        from dsv4_operator.canary.harness import run_canary  # the classifier comes with it

        report = await run_canary(
            self.client,
            self.upstream,
            model=asked.model,
            sessions=asked.sessions,
            rounds=asked.rounds,
            timeout=REQUEST_TIMEOUT_S,
            seed=random.randrange(1 << 30),  # fresh prompts: runs are independent samples
        )
        return RunCounts.of(report)

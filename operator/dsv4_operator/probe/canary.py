"""Multi-turn tool-calling canary: N concurrent sessions x R rounds, every response classified.

Each session is an agent conversation of R tool-calling rounds; a round whose response is not
`ok` ends its session. The canary is split by job and this module gathers its public names
(import from here): `scenario` (the conversation: tools, prompts, fake tool results),
`transport` (model discovery, one request, which failures are retried, the typed errors),
`report` (records, session results, the per-response and per-session leak rates) and
`harness` (`run_canary`).
"""

from __future__ import annotations

from dsv4_operator.probe.harness import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE, run_canary
from dsv4_operator.probe.report import EXAMPLES, CanaryReport, Per, ResponseRecord, SessionResult
from dsv4_operator.probe.scenario import (
    CANARY_TOOLS,
    SYSTEM_PROMPT,
    Step,
    fake_result,
    first_messages,
    session_steps,
)
from dsv4_operator.probe.transport import (
    MAX_ATTEMPTS,
    RETRY_BACKOFF_S,
    EndpointError,
    EndpointUnreachable,
    ProbeError,
    discover_model,
    normalise_base_url,
)

__all__ = [
    "CANARY_TOOLS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_TEMPERATURE",
    "EXAMPLES",
    "MAX_ATTEMPTS",
    "RETRY_BACKOFF_S",
    "SYSTEM_PROMPT",
    "CanaryReport",
    "EndpointError",
    "EndpointUnreachable",
    "Per",
    "ProbeError",
    "ResponseRecord",
    "SessionResult",
    "Step",
    "discover_model",
    "fake_result",
    "first_messages",
    "normalise_base_url",
    "run_canary",
    "session_steps",
]

"""The canary's scenario: its tools, system prompt, per-session steps and fake tool results.

Like the incident's 60x4 / 80x6 repro harness: each session is an agent conversation whose every
round must call one of three tools (`get_weather`, `search_docs`, `run_sql`, with JSON
schemas). The first round's user message lists R steps; after each tool call the harness
appends the assistant message and a fake tool result (which names the next step) and sends the
conversation again. A round whose response is not `ok` ends its session: a corrupted turn has
no tool call to answer, so the conversation cannot go on (as in the incident's harness).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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

"""Corpora for the DSML detector's tests and benchmark (test data, not part of the double's API).

- `PARAGRAPHS`: normal prose written for this corpus (explanations, narrative, markdown lists and
  tables, a little code, numbers, Chinese), the kind of text a model legitimately answers with.
- `normal_prose()`: those paragraphs, the Zen of Python, and the docstrings of a fixed list of
  standard-library modules (prose with examples, tables and doctests), >= 80 characters each.
- `mixed_responses(n, seed)`: chat-completion responses, half well-formed tool calls and half
  every leak shape of `shapes.Shape` in turn, with the verdict each must get.
"""

from __future__ import annotations

import codecs
import importlib
import inspect
import json
import random
from dataclasses import dataclass
from typing import Any

from dsv4_engine_double import shapes

PARAGRAPHS: list[str] = [
    "The operator keeps one engine configuration for both roles. Prefill and decode therefore "
    "always agree on the index-K dtype, the KV cache dtype and the page size, and a rollout "
    "that changes any of them replaces both roles together instead of one at a time.",
    "When the canary reports a leak rate above the threshold, the guard does not act on a "
    "single bad response. It waits until the lower bound of the confidence interval is above "
    "the threshold, which needs a few dozen samples at the rates we care about.",
    "Yesterday's deployment went smoothly. The new image rolled out to the decode pods first, "
    "the router picked them up within a minute, and the error budget did not move at all.",
    "To reproduce the problem, start sixty sessions with four rounds each, and make every round "
    "call a tool. At one session nothing goes wrong; at sixty, roughly one session in six "
    "returns markup instead of a structured call.",
    "Here are the steps:\n1. Check the weather in Hangzhou.\n2. Search the documentation for "
    "the bootstrap port.\n3. Run the SQL query on the analytics database.\n4. Summarise the "
    "results in two sentences.",
    "| metric | meaning |\n| --- | --- |\n| token_usage | share of the KV pool in use |\n"
    "| num_running_reqs | requests in the running batch |\n| gen_throughput | tokens per "
    "second |",
    "The weather in Paris today is mild: 18 degrees, light wind from the west, and a small "
    "chance of rain in the evening. Tomorrow looks similar, a little warmer in the afternoon.",
    "I could not find a section about eviction in the HiCache guide, but the configuration "
    "reference lists the write policies: write_through, write_back and write_through_selective.",
    "The query returned three rows. The north region had 1,204 orders, the south region 987, "
    "and the west region 1,530, which is about twelve percent more than last week.",
    "Memory planning matters because the engine sizes its pools from the fraction of GPU "
    "memory you give it. If it assumes 132 bytes per token for the indexer while the real "
    "buffer uses 256, it promises memory it does not have.",
    "```python\nimport httpx\n\nasync def main() -> None:\n    async with httpx.AsyncClient() "
    "as client:\n        response = await client.get('http://localhost:8000/health')\n"
    "        print(response.status_code)\n```\nThe snippet prints 200 when the server is up.",
    "Good question. The short answer is yes, but with a caveat: the number of sessions the "
    "cluster can hold depends on context length, and long agent conversations grow quickly.",
    "我们在六十个并发会话下复现了这个问题。关闭分层缓存以后，错误率降到了零，所以问题和缓存的同步有关。",
    "The dashboard has three panels: the leak rate with its confidence band, the canary "
    "responses by verdict, and the OOM events by role. Alerts fire on the first two.",
    "Once upon a time a small team ran a large model on eight GPUs. Everything worked at one "
    "user. At sixty users the answers turned to salad, and it took them a week to see why.",
    "Please note that the bootstrap port of every prefill server must match the port the "
    "router passes along with its URL; otherwise decode workers cannot start the KV transfer.",
    "- rollout: Auto\n- safety policy: Enforce\n- guard: enabled, canary every 60 seconds\n"
    "- leak threshold: 2 percent at 99 percent confidence\n- bake time: 10 minutes",
    "Results for 'CUDA graph capture': the engine captures graphs for batch sizes up to "
    "cuda-graph-max-bs. Larger batches fall back to eager mode, which is slower but correct.",
    "Thanks for the details. I looked at the logs you sent: the scheduler ran out of memory "
    "while capturing graphs, so lowering mem-fraction-static a little should be enough.",
    "Error budgets are easier to reason about per session than per response, because one bad "
    "turn usually ends the conversation for the agent that depends on it.",
    "Step 1 is done: it is 22 degrees in Lima. Step 2 is done: the docs say the router retries "
    "failed requests once. Step 3 is done: the query found 41 slow services.",
    "The version numbers follow the upstream release, with a suffix for the patch set: "
    "0.5.16-p3 is the third patch set on top of 0.5.16.",
    "No, the operator never edits your spec. It records the bad configuration in the status, "
    "renders the children from the last known good revision, and tells you why in an event.",
    "Ha, that is a fun one. The failing test only runs on Tuesdays because the fixture builds "
    "its date from the weekday; pin the clock and it passes every day of the week.",
    "Latency percentiles: p50 0.21 s, p95 0.48 s, p99 0.71 s. Throughput held at about 530 "
    "tokens per second at thirty-two concurrent sessions.",
    "| parser | markup | model |\n| --- | --- | --- |\n| deepseekv32 | DSML | V3.2 |\n"
    "| deepseekv4 | DSML | V4 |\nThe DSML parser turns the model's markup into tool calls; "
    "when parsing fails, the markup ends up in the content field instead.",
]


def _zen() -> str:
    import contextlib
    import io

    # `import this` prints the Zen (ROT13-encoded in the module); decode it without printing.
    with contextlib.redirect_stdout(io.StringIO()):
        this = importlib.import_module("this")
    return codecs.decode(str(this.s), "rot13")


STDLIB_MODULES = (
    "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures",
    "contextlib", "csv", "dataclasses", "datetime", "decimal", "difflib", "email", "enum",
    "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "html", "http.client",
    "inspect", "io", "ipaddress", "itertools", "json", "logging", "math", "mimetypes",
    "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "sched", "secrets",
    "selectors", "shlex", "shutil", "socket", "sqlite3", "statistics", "string", "struct",
    "subprocess", "tarfile", "tempfile", "textwrap", "threading", "time", "timeit", "tokenize",
    "traceback", "typing", "unittest", "urllib.parse", "uuid", "warnings", "weakref",
    "xml.etree.ElementTree", "zipfile", "zoneinfo",
)  # fmt: skip


def stdlib_docstrings(min_chars: int = 80) -> list[str]:
    """Docstrings of the modules above and of their public members (deduplicated, sorted)."""
    found: set[str] = set()
    for name in STDLIB_MODULES:
        module = importlib.import_module(name)
        objects: list[Any] = [module]
        for attr in dir(module):
            if attr.startswith("_"):
                continue
            try:
                objects.append(getattr(module, attr))
            except AttributeError:
                continue
        for obj in objects:
            doc = inspect.getdoc(obj)
            if doc and len(doc) >= min_chars:
                found.add(doc)
    return sorted(found)


def normal_prose() -> list[str]:
    return [*PARAGRAPHS, _zen(), *stdlib_docstrings()]


@dataclass(frozen=True)
class Sample:
    response: dict[str, Any]
    tools: list[dict[str, Any]]
    must_call: bool
    expected: str  # verdict kind
    shape: str  # "well_formed" or a shapes.Shape value


def mixed_responses(n: int, seed: int, tools: list[dict[str, Any]]) -> list[Sample]:
    """`n` responses: even indices well-formed (some with prose content or streaming-shaped
    reasoning), odd indices cycling through every leak shape."""
    rng = random.Random(seed)
    names = shapes.tool_names(tools)
    all_shapes = list(shapes.Shape)
    samples: list[Sample] = []
    for i in range(n):
        call = shapes.make_call(tools, rng.choice(names), rng)
        if i % 2 == 0:
            reasoning = shapes.reasoning_for(*call, rng) if rng.random() < 0.7 else None
            message, finish = shapes.well_formed([call], rng, reasoning=reasoning)
            if rng.random() < 0.3:
                message["content"] = rng.choice(PARAGRAPHS)
            expected, shape = "ok", "well_formed"
        else:
            which = all_shapes[(i // 2) % len(all_shapes)]
            message, finish = shapes.corrupted(which, tools, call, rng)
            expected, shape = shapes.EXPECTED_KIND[which], which.value
        response = shapes.completion(message, finish, model="dsv4", rng=rng)
        samples.append(Sample(json.loads(json.dumps(response)), tools, True, expected, shape))
    return samples

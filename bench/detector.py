"""Benchmark: DSML detector throughput and the degenerate heuristic's false-positive rate.

Throughput: classifications per second of `leak.classifier.classify_response` on a mixed corpus
(half well-formed tool calls, half every leak shape of the engine double in turn), and of SSE
assembly plus classification on the same responses streamed. Also checks every verdict against
the expected one. Then MB/s and classifications/s on long assistant messages, 2-20 KB of prose
each, half with a tool call whose argument carries half of it (the size the tap classifies in
production; the target is >= 20 MB/s and >= 2,000 classifications/s per core), and again with
typographic quotes and dashes (non-ASCII text takes slower paths). MB are the UTF-8 bytes of
the response JSON. Beside each, in the same run and interleaved with it response by response,
the regex floor: one scan of the same response JSON by one regex joining every markup pattern
(what a detector that only looked for markup would cost); the detector's MB/s over the floor's
is the ratio to read (the target is >= 0.5; absolute figures move with the machine's load).
False positives: the share of normal-prose texts (written paragraphs, the Zen of Python,
standard library docstrings) that the degenerate heuristic or the markup check flags.

    python bench/detector.py [--responses 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time

from dsv4_engine_double import shapes
from dsv4_engine_double.corpus import mixed_responses, normal_prose
from dsv4_operator.canary.scenario import CANARY_TOOLS
from dsv4_operator.leak.classifier import classify_response
from dsv4_operator.leak.degenerate import degenerate_reason
from dsv4_operator.leak.markup import MARKUP_PATTERNS, find_markup
from dsv4_operator.leak.sse import assemble_stream


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    samples = mixed_responses(args.responses, seed=1, tools=CANARY_TOOLS)
    wrong = [
        (s.shape, s.expected, v.kind.value)
        for s in samples
        if (v := classify_response(s.response, tools=s.tools, must_call=True)).kind.value
        != s.expected
    ]
    rates = []
    for _ in range(args.repeat):
        began = time.perf_counter()
        for s in samples:
            classify_response(s.response, tools=s.tools, must_call=True)
        rates.append(len(samples) / (time.perf_counter() - began))
    rng = random.Random(2)
    streams = [
        shapes.sse_text(shapes.stream_chunks(s.response, rng))
        for s in samples[: args.responses // 4]
    ]
    began = time.perf_counter()
    for text, s in zip(streams, samples, strict=False):
        classify_response(assemble_stream(text), tools=s.tools, must_call=True)
    stream_rate = len(streams) / (time.perf_counter() - began)

    prose = normal_prose()
    long_rate, long_mb, long_floor = _long_messages(prose, args.repeat)
    # The same with typographic quotes and dashes: non-ASCII text takes the slower paths.
    typographic = [t.replace("'", "\u2019").replace(" - ", " \u2014 ") for t in prose]
    typo_rate, typo_mb, typo_floor = _long_messages(typographic, args.repeat)
    chars = sum(len(t) for t in prose)
    degenerate = [t for t in prose if degenerate_reason(t) is not None]
    markup = [t for t in prose if find_markup(t) is not None]
    print(
        f"detector throughput: {statistics.median(rates):,.0f} classifications/s "
        f"(median of {args.repeat}; min {min(rates):,.0f}, max {max(rates):,.0f}) on "
        f"{len(samples):,} mixed responses ({len(shapes.Shape)} leak shapes + well-formed)"
    )
    print(f"streamed (SSE assembly + classify): {stream_rate:,.0f} responses/s")
    print(
        f"2-20 KB assistant messages (half with a tool call): {long_rate:,.0f} "
        f"classifications/s, {long_mb:.2f} MB/s of response JSON (median of {args.repeat})"
    )
    print(
        f"  regex floor (one combined markup regex over the same JSON, same run): "
        f"{long_floor:.2f} MB/s; detector/regex {long_mb / long_floor:.2f}"
    )
    print(
        f"  the same with typographic quotes and dashes (non-ASCII): {typo_rate:,.0f} "
        f"classifications/s, {typo_mb:.2f} MB/s; regex floor {typo_floor:.2f} MB/s; "
        f"detector/regex {typo_mb / typo_floor:.2f}"
    )
    print(
        f"verdicts different from expected: {len(wrong)}" + (f" e.g. {wrong[:3]}" if wrong else "")
    )
    print(
        f"false positives on normal prose ({len(prose):,} texts, {chars:,} chars): degenerate "
        f"{len(degenerate)} ({len(degenerate) / len(prose):.2%}), markup {len(markup)} "
        f"({len(markup) / len(prose):.2%})"
    )
    for text in degenerate[:3] + markup[:3]:
        print(f"  flagged: {text[:100]!r}")
    return 1 if wrong else 0


def _long_messages(prose: list[str], repeat: int) -> tuple[float, float, float]:
    """(classifications/s, MB/s, the regex floor's MB/s) on 400 responses of 2-20 KB built
    from normal prose."""
    rng = random.Random(3)

    def text(size: int) -> str:
        parts: list[str] = []
        while sum(map(len, parts)) < size:
            parts.append(rng.choice(prose))
        return "\n\n".join(parts)[:size]

    tool = CANARY_TOOLS[0]["function"]
    responses = []
    for i in range(400):
        size = rng.randint(2000, 20000)
        message: dict[str, object] = {"role": "assistant", "content": text(size)}
        if i % 2 == 0:
            arguments = json.dumps({"location": text(size // 2), "unit": "celsius"})
            message["content"] = text(size // 2)
            message["tool_calls"] = [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": tool["name"], "arguments": arguments},
                }
            ]
        responses.append({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
    documents = [json.dumps(r, ensure_ascii=False) for r in responses]
    size_mb = sum(len(d.encode()) for d in documents) / 1e6
    verdicts = {
        classify_response(r, tools=CANARY_TOOLS, must_call=False).kind.value for r in responses
    }
    assert verdicts == {"ok"}, verdicts  # normal prose: nothing to flag
    floor = re.compile("|".join(f"(?{_flags(p)}:{p.pattern})" for p in MARKUP_PATTERNS))
    assert not any(map(floor.search, documents))  # so each scan runs to the end
    detector_s, floor_s = [], []
    clock = time.perf_counter
    for _ in range(repeat):  # interleaved response by response: load hits both alike
        detector, regex = 0.0, 0.0
        for r, d in zip(responses, documents, strict=True):
            began = clock()
            classify_response(r, tools=CANARY_TOOLS, must_call=False)
            middle = clock()
            floor.search(d)
            detector, regex = detector + middle - began, regex + clock() - middle
        detector_s.append(detector)
        floor_s.append(regex)
    elapsed = statistics.median(detector_s)
    return len(responses) / elapsed, size_mb / elapsed, size_mb / statistics.median(floor_s)


def _flags(pattern: re.Pattern[str]) -> str:
    """The inline flag that keeps `pattern`'s case-insensitivity inside the joined regex."""
    return "i" if pattern.flags & re.IGNORECASE else "-i"


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: DSML detector throughput and the degenerate heuristic's false-positive rate.

Throughput: classifications per second of `dsml.classify` on a mixed corpus (half well-formed
tool calls, half every leak shape of the engine double in turn), and of SSE assembly plus
classification on the same responses streamed. Also checks every verdict against the expected
one. False positives: the share of normal-prose texts (written paragraphs, the Zen of Python,
standard-library docstrings) that the degenerate heuristic or the markup check flags.

    python bench/detector.py [--responses 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.engine_double import shapes  # noqa: E402
from tests.engine_double.corpus import mixed_responses, normal_prose  # noqa: E402

from dsv4_operator.probe.canary import CANARY_TOOLS  # noqa: E402
from dsv4_operator.probe.dsml import (  # noqa: E402
    assemble_stream,
    classify,
    degenerate_reason,
    find_markup,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    samples = mixed_responses(args.responses, seed=1, tools=CANARY_TOOLS)
    wrong = [
        (s.shape, s.expected, v.kind.value)
        for s in samples
        if (v := classify(s.response, tools=s.tools, must_call=True)).kind.value != s.expected
    ]
    rates = []
    for _ in range(args.repeat):
        began = time.perf_counter()
        for s in samples:
            classify(s.response, tools=s.tools, must_call=True)
        rates.append(len(samples) / (time.perf_counter() - began))
    rng = random.Random(2)
    streams = [
        shapes.sse_text(shapes.stream_chunks(s.response, rng))
        for s in samples[: args.responses // 4]
    ]
    began = time.perf_counter()
    for text, s in zip(streams, samples, strict=False):
        classify(assemble_stream(text), tools=s.tools, must_call=True)
    stream_rate = len(streams) / (time.perf_counter() - began)

    prose = normal_prose()
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


if __name__ == "__main__":
    sys.exit(main())

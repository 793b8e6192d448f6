"""DSML detector: classify one OpenAI chat-completion response as ok or as a kind of leak.

The detector is split by job; this module gathers its public names (import from here):

- `verdict`: `Verdict`, `VerdictKind`, `LEAK_KINDS`, `SNIPPET_CHARS`;
- `markup`: `find_markup` (DSML, special tokens, tool-call and think tags);
- `degenerate`: `degenerate_reason` (loops, repeated segments, tag soup, garbage);
- `classifier`: `classify` (the order of the checks), `InvalidToolSchema`;
- `sse`: `assemble_stream`, `StreamError`, `IncompleteStream`.
"""

from __future__ import annotations

from dsv4_operator.probe.classifier import InvalidToolSchema, classify
from dsv4_operator.probe.degenerate import degenerate_reason
from dsv4_operator.probe.markup import find_markup
from dsv4_operator.probe.sse import DONE, IncompleteStream, StreamError, assemble_stream
from dsv4_operator.probe.verdict import LEAK_KINDS, SNIPPET_CHARS, Verdict, VerdictKind

__all__ = [
    "DONE",
    "LEAK_KINDS",
    "SNIPPET_CHARS",
    "IncompleteStream",
    "InvalidToolSchema",
    "StreamError",
    "Verdict",
    "VerdictKind",
    "assemble_stream",
    "classify",
    "degenerate_reason",
    "find_markup",
]

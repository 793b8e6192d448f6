"""What the detector concludes about one response: a `Verdict` of one `VerdictKind`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

SNIPPET_CHARS = 200
_SNIPPET_LEAD = 40


class VerdictKind(StrEnum):
    """What the detector concluded about one response."""

    OK = "ok"
    LEAKED_MARKUP = "leaked_markup"
    MALFORMED_CALL = "malformed_call"
    MISSING_CALL = "missing_call"
    DEGENERATE = "degenerate"
    ERROR = "error"

    @property
    def is_leak(self) -> bool:
        """True for the kinds that count as a corrupted response."""
        return self in LEAK_KINDS


LEAK_KINDS = frozenset(
    {
        VerdictKind.LEAKED_MARKUP,
        VerdictKind.MALFORMED_CALL,
        VerdictKind.MISSING_CALL,
        VerdictKind.DEGENERATE,
    }
)


@dataclass(frozen=True)
class Verdict:
    """One classification: its kind, a short reason, and up to 200 chars of offending text."""

    kind: VerdictKind
    reason: str
    snippet: str = ""

    @property
    def leak(self) -> bool:
        return self.kind.is_leak

    @classmethod
    def ok(cls) -> Verdict:
        return cls(VerdictKind.OK, "well-formed")

    @classmethod
    def error(cls, reason: str, snippet: str = "") -> Verdict:
        """An HTTP error, timeout or transport failure (built by the harness)."""
        return cls(VerdictKind.ERROR, reason, snippet[:SNIPPET_CHARS])

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind.value, "reason": self.reason, "snippet": self.snippet}


def snippet(text: str, start: int = 0) -> str:
    """Up to `SNIPPET_CHARS` of `text`, starting a little before `start`."""
    begin = max(0, start - _SNIPPET_LEAD)
    return text[begin : begin + SNIPPET_CHARS]

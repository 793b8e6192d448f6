"""Whether a desired object is already in place, so a no-op resync writes nothing."""

from __future__ import annotations

import json
from typing import Any

from dsv4_operator.names import APPLIED_ANNOTATION
from dsv4_operator.revisions.hashing import canonical_hash

APPLIED_HASH_LENGTH = 16


def content_hash(obj: dict[str, Any]) -> str:
    return canonical_hash(obj, APPLIED_HASH_LENGTH)


def stamped(desired: dict[str, Any]) -> dict[str, Any]:
    """The desired object annotated with the hash of its own content."""
    out: dict[str, Any] = json.loads(json.dumps(desired))
    out["metadata"].setdefault("annotations", {})[APPLIED_ANNOTATION] = content_hash(desired)
    return out


def _subset(want: Any, have: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(
            k in have and _subset(v, have[k]) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(_subset(w, h) for w, h in zip(want, have, strict=True))
        )
    # The API server stores quantities and int-or-strings as strings ("4" for 4).
    return bool(want == have or str(want) == str(have))


def in_place(desired_stamped: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """Live carries the same applied hash and still holds every desired field (no drift)."""
    if live is None:
        return False
    want_hash = desired_stamped["metadata"]["annotations"][APPLIED_ANNOTATION]
    have_hash = live.get("metadata", {}).get("annotations", {}).get(APPLIED_ANNOTATION)
    return bool(want_hash == have_hash and _subset(desired_stamped, live))

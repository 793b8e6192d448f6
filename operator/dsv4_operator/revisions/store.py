"""ControllerRevisions: one per effective engine config, numbered, pruned beyond a history limit.

The object itself is a child like any other and is built in render/children.py.
"""

from __future__ import annotations

from dsv4_operator.kube.objects import Obj
from dsv4_operator.names import REVISION_LABEL


def revision_hash(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("labels", {}).get(REVISION_LABEL, ""))


def next_number(revisions: list[Obj]) -> int:
    return max((int(r.get("revision", 0)) for r in revisions), default=0) + 1


def to_prune(revisions: list[Obj], limit: int, keep: set[str]) -> list[str]:
    """Names of the oldest revisions beyond `limit`, never one whose hash is in `keep`."""
    ordered = sorted(revisions, key=lambda r: int(r.get("revision", 0)), reverse=True)
    excess = [r for r in ordered[limit:] if revision_hash(r) not in keep]
    return [r["metadata"]["name"] for r in excess]

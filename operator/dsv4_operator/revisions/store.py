"""ControllerRevisions: one per effective engine config, numbered, pruned beyond a history limit.

The object itself is a child like any other and is built in render/children.py.
"""

from __future__ import annotations

from dsv4_operator.kube.objects import RevisionView


def next_number(revisions: list[RevisionView]) -> int:
    return max((r.number for r in revisions), default=0) + 1


def to_prune(revisions: list[RevisionView], limit: int, keep: set[str]) -> list[str]:
    """Names of the oldest revisions beyond `limit`, never one whose hash is in `keep`."""
    ordered = sorted(revisions, key=lambda r: r.number, reverse=True)
    excess = [r for r in ordered[limit:] if r.hash not in keep]
    return [r.name for r in excess]

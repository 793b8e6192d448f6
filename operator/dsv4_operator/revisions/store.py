"""ControllerRevisions: one per effective engine config, numbered, pruned beyond a history limit."""

from __future__ import annotations

from typing import Any

from dsv4_operator.render.context import FORMAT_LABEL, REVISION_LABEL, Manifest, RenderContext

Obj = dict[str, Any]


def revision_name(deployment: str, revision: str) -> str:
    return f"{deployment}-{revision}"


def controller_revision(ctx: RenderContext, number: int) -> Manifest:
    """The stored config of ctx's revision: the spec it was rendered from (for rollback)."""
    meta = ctx.metadata(revision_name(ctx.name, ctx.revision))
    meta["labels"][REVISION_LABEL] = ctx.revision
    meta["labels"][FORMAT_LABEL] = ctx.transfer_format
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": meta,
        "data": {
            "spec": ctx.spec.to_wire(),
            "revision": ctx.revision,
            "transferFormat": ctx.transfer_format,
        },
        "revision": number,
    }


def revision_hash(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("labels", {}).get(REVISION_LABEL, ""))


def next_number(revisions: list[Obj]) -> int:
    return max((int(r.get("revision", 0)) for r in revisions), default=0) + 1


def to_prune(revisions: list[Obj], limit: int, keep: set[str]) -> list[str]:
    """Names of the oldest revisions beyond `limit`, never one whose hash is in `keep`."""
    ordered = sorted(revisions, key=lambda r: int(r.get("revision", 0)), reverse=True)
    excess = [r for r in ordered[limit:] if revision_hash(r) not in keep]
    return [r["metadata"]["name"] for r in excess]

"""Whether a desired object is already in place, so a no-op resync writes nothing."""

from __future__ import annotations

import json
from typing import Any

from dsv4_operator.kube.objects import Obj
from dsv4_operator.names import APPLIED_ANNOTATION
from dsv4_operator.revisions.hashing import canonical_hash

APPLIED_HASH_LENGTH = 16


def content_hash(obj: Obj) -> str:
    return canonical_hash(obj, APPLIED_HASH_LENGTH)


def stamped(desired: Obj) -> Obj:
    """The desired object annotated with the hash of its own content."""
    out: Obj = json.loads(json.dumps(desired))
    out["metadata"].setdefault("annotations", {})[APPLIED_ANNOTATION] = content_hash(desired)
    return out


# The merge keys of the lists the operator renders (containers, env, volumes, ports, mounts):
# Kubernetes merges these by key, so another writer (a mutating webhook injecting a sidecar or
# an env var) may add items; the operator's own items must be there, unchanged.
# Kubernetes' own merge keys first (a volumeMount also has a `name`, but merges by mountPath).
MERGE_KEYS = ("mountPath", "containerPort", "devicePath", "name")


def _merge_key(items: list[Any]) -> str | None:
    """The key these items merge by, if every item has it and no two share a value."""
    for key in MERGE_KEYS:
        if items and all(isinstance(i, dict) and key in i for i in items):
            values = [i[key] for i in items]
            return key if len(set(map(str, values))) == len(values) else None
    return None


def _subset(want: Any, have: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(
            k in have and _subset(v, have[k]) for k, v in want.items()
        )
    if isinstance(want, list):
        if not isinstance(have, list):
            return False
        key = _merge_key(want)
        if key is not None:  # each desired item present by key; items others added are fine
            by_key = {h.get(key): h for h in have if isinstance(h, dict)}
            return all(w[key] in by_key and _subset(w, by_key[w[key]]) for w in want)
        # Atomic lists (args, command, tolerations): exactly the desired items, in order.
        return len(want) == len(have) and all(
            _subset(w, h) for w, h in zip(want, have, strict=True)
        )
    # The API server stores quantities and int-or-strings as strings ("4" for 4).
    return bool(want == have or str(want) == str(have))


def in_place(desired_stamped: Obj, live: Obj | None) -> bool:
    """Live carries the same applied hash and still holds every desired field (no drift)."""
    if live is None:
        return False
    want_hash = desired_stamped["metadata"]["annotations"][APPLIED_ANNOTATION]
    have_hash = live.get("metadata", {}).get("annotations", {}).get(APPLIED_ANNOTATION)
    return bool(want_hash == have_hash and _subset(desired_stamped, live))

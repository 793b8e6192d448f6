"""Whether a desired object is already in place, so a no-op resync writes nothing."""

from __future__ import annotations

import json
from typing import Any

from dsv4_operator.kube.objects import Obj
from dsv4_operator.names import APPLIED_ANNOTATION
from dsv4_operator.revisions.hashing import canonical_json, json_hash

APPLIED_HASH_LENGTH = 16
# How many (live object version, desired content) pairs found in place are remembered: every
# child of a thousand deployments, with room for the versions a rollout goes through.
IN_PLACE_REMEMBERED = 16384


def _stamp(canonical: str, digest: str) -> Obj:
    # The copy is parsed from the canonical JSON the hash is of: one serialisation, not two.
    out: Obj = json.loads(canonical)
    out["metadata"].setdefault("annotations", {})[APPLIED_ANNOTATION] = digest
    return out


def to_apply(desired: Obj, live: Obj | None) -> Obj | None:
    """`desired` annotated with the hash of its own content, to apply; None when `live`
    already carries that hash and holds every desired field (no drift)."""
    canonical = canonical_json(desired)
    digest = json_hash(canonical, APPLIED_HASH_LENGTH)
    if live is not None and _holds(live, desired, digest):
        return None
    return _stamp(canonical, digest)


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


class _InPlaceMemo:
    """The (uid, resourceVersion, desired hash) triples found in place, oldest first.

    A pass checks every child against its desired content, and an idle deployment's pass
    finds the same live versions and the same content each time: the API server gives an
    object a new resourceVersion on every change, and the hash is of the whole desired
    object, so a triple's answer never changes. Only "in place" is kept (drift is applied,
    which makes a new version)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held: dict[tuple[str, str, str], None] = {}

    def __contains__(self, key: tuple[str, str, str]) -> bool:
        return key in self._held

    def add(self, key: tuple[str, str, str]) -> None:
        if len(self._held) >= self.size:
            del self._held[next(iter(self._held))]
        self._held[key] = None


_IN_PLACE = _InPlaceMemo(IN_PLACE_REMEMBERED)


def _holds(live: Obj, desired: Obj, digest: str) -> bool:
    """`live` carries the applied hash `digest` (of `desired`) and still holds every field of
    `desired` (no drift)."""
    meta = live.get("metadata", {})
    if digest != meta.get("annotations", {}).get(APPLIED_ANNOTATION):
        return False
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    key = (str(uid), str(version), digest) if uid and version else None
    if key is not None and key in _IN_PLACE:
        return True
    held = _subset(desired, live)
    if held and key is not None:
        _IN_PLACE.add(key)
    return held

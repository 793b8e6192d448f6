"""What reads go through: the watch cache serves them, `KubeClient` too (no cache).

The protocols live here, beside the client, so the reconcile and the guard's I/O depend on
kube/ alone, never on the runtime that builds the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import Resource


class Reader(Protocol):
    """Reads as the reconcile needs them: the cache serves them, `KubeClient` too (no cache)."""

    async def get(self, res: Resource, namespace: str | None, name: str) -> Obj | None: ...

    async def list(
        self, res: Resource, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[Obj]: ...

    async def serves(self, res: Resource) -> bool: ...


class CachedReader(Reader, Protocol):
    """A Reader that keeps what it serves, so the operator's own writes are folded in."""

    def observe(self, obj: Obj) -> None:
        """Fold in an object the API server returned for the operator's own write."""

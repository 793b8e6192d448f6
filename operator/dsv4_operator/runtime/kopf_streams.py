"""kopf's list+watch streams: the one place the operator imports kopf's private modules.

Why kopf's streams (`kopf._cogs.clients.watching.continuous_watch`, kopf pinned in
pyproject.toml): they are the maintained list+watch the operator already runs on: chunked
LIST, then WATCH from the list's resourceVersion with bookmarks (so the version stays fresh
while nothing changes), resumption from the last seen version after a disconnect, a new
LIST after `410 Gone`, server-side label selectors, and kopf's login/re-login. kopf's
public indexes (`@kopf.index`) sit on the same streams but never learn of an object deleted
while a watch was down: after a 410 kopf re-lists without dropping what the new list lacks.
One call of `continuous_watch` is one list+watch session, so the watch cache
(runtime/cache.py) can apply a client-go informer's "replace" rule at the list's end
(`Bookmark.LISTED`): whatever the new list lacks is gone. tests/integration/test_cache.py
pins that contract on a real API server, so a kopf upgrade that changes it fails there.
"""

from __future__ import annotations

from collections.abc import Callable

import kopf
from kopf._cogs.clients.errors import APINotFoundError
from kopf._cogs.clients.watching import Bookmark, continuous_watch, streaming_block
from kopf._cogs.structs.references import NamespaceName, Selector
from kopf._cogs.structs.references import Resource as KopfResource

from dsv4_operator.kube.resources import Resource

__all__ = [
    "APINotFoundError",
    "Bookmark",
    "KopfResource",
    "NamespaceName",
    "continuous_watch",
    "kopf_resource",
    "select_by_label",
    "streaming_block",
]


def kopf_resource(res: Resource) -> KopfResource:
    group, _, version = res.api_version.rpartition("/")
    return KopfResource(group, version, res.plural, kind=res.kind, namespaced=True)


def _same_kind(kres: KopfResource) -> Callable[[KopfResource], bool]:
    def same(other: KopfResource) -> bool:
        return other.group == kres.group and other.plural == kres.plural

    return same


def select_by_label(settings: kopf.OperatorSettings, res: Resource, label_selector: str) -> None:
    """Have the API server filter `res`'s streams by `label_selector`."""
    selector = Selector(_same_kind(kopf_resource(res)))
    settings.watching.label_selectors[selector] = label_selector

"""The watch cache never goes back to before the operator's own write."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import DSV4, Resource
from dsv4_operator.runtime.cache import WatchCache, Watched


def _deployment(version: str, phase: str) -> Obj:
    return {
        "apiVersion": DSV4.api_version,
        "kind": DSV4.kind,
        "metadata": {"namespace": "ns", "name": "dsv4-flash", "resourceVersion": version},
        "status": {"phase": phase},
    }


def _cache(changes: list[tuple[str, bool]], own: list[str] | None = None) -> WatchCache:
    written = own if own is not None else []

    def listener(res: Resource, obj: Obj, deleted: bool, own: bool = False) -> None:
        version = obj["metadata"]["resourceVersion"]
        if own:
            written.append(version)
        else:
            changes.append((version, deleted))

    return WatchCache(kopf.OperatorSettings(), [Watched(DSV4)], ["ns"], listener)


def _phase(cache: WatchCache) -> Any:
    obj = asyncio.run(cache.get(DSV4, "ns", "dsv4-flash"))
    return obj and obj["status"]["phase"]


def test_an_event_the_watch_delivers_after_the_operators_later_write_is_not_folded_in() -> None:
    changes: list[tuple[str, bool]] = []
    own: list[str] = []
    cache = _cache(changes, own)
    cache.fold(DSV4, "ADDED", _deployment("10", "Pending"))
    cache.observe(_deployment("12", "Progressing"))  # the reply to the operator's write
    cache.fold(DSV4, "MODIFIED", _deployment("11", "Pending"))  # late: an earlier change
    assert _phase(cache) == "Progressing"
    cache.fold(DSV4, "MODIFIED", _deployment("12", "Progressing"))  # the write itself
    cache.fold(DSV4, "MODIFIED", _deployment("13", "Ready"))  # someone else's, later
    assert _phase(cache) == "Ready"
    # Told of the first object and of the later change, not of the stale event; of the
    # operator's own write once, as its own, and not again when its watch event comes.
    assert changes == [("10", False), ("13", False)]
    assert own == ["12"]


def test_a_late_deletion_does_not_remove_the_object_created_again_since() -> None:
    changes: list[tuple[str, bool]] = []
    cache = _cache(changes)
    cache.fold(DSV4, "ADDED", _deployment("10", "Pending"))
    cache.observe(_deployment("15", "Pending"))  # created again by the operator
    cache.fold(DSV4, "DELETED", _deployment("14", "Pending"))  # the old one's deletion
    assert _phase(cache) == "Pending"
    cache.fold(DSV4, "DELETED", _deployment("16", "Pending"))  # a deletion after it
    assert _phase(cache) is None
    assert changes == [("10", False), ("16", True)]


def test_the_reply_of_a_write_made_before_a_deletion_does_not_bring_the_object_back() -> None:
    """A pass's status write committed at 15, the object deleted at 20, the watch's deletion
    folded in before the write's reply: the reply must not resurrect it (nothing would remove
    it again, and the operator would go on reconciling a deleted deployment)."""
    changes: list[tuple[str, bool]] = []
    cache = _cache(changes)
    cache.fold(DSV4, "ADDED", _deployment("10", "Pending"))
    cache.fold(DSV4, "DELETED", _deployment("20", "Pending"))
    cache.observe(_deployment("15", "Progressing"))  # the write's late reply
    assert _phase(cache) is None
    cache.observe(_deployment("25", "Pending"))  # created again since: kept
    assert _phase(cache) == "Pending"
    assert changes == [("10", False), ("20", True)]


def test_the_operators_own_write_is_told_once_whichever_comes_first_reply_or_event() -> None:
    """The reply to a write and its watch event race: whichever the cache takes up first is
    the one the listener hears of (a DSV4Model created by a deployment's pass was never
    reconciled when the reply won and its ADDED event then told no one)."""
    for reply_first in (True, False):
        changes: list[tuple[str, bool]] = []
        own: list[str] = []
        cache = _cache(changes, own)
        if reply_first:
            cache.observe(_deployment("7", "Pending"))
        cache.fold(DSV4, "ADDED", _deployment("7", "Pending"))
        if not reply_first:
            cache.observe(_deployment("7", "Pending"))
        told = len(changes) + len(own)
        assert told == 1, (reply_first, changes, own)
        assert (own == ["7"]) is reply_first

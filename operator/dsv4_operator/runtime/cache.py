"""A watch-backed cache of every object a reconcile reads, fed by kopf's watch streams.

kopf's streams and why they are used: runtime/kopf_streams.py.

Children and pods are watched with a server-side selector (`managed-by=dsv4-operator`),
never every pod in the cluster. Reads are served from memory (callers must not mutate what
they get); `observe()` folds the reply of the operator's own write in, so the next pass does
not act again on a stale copy, and tells the listener of it (`own`). `metadata.managedFields`
is dropped (memory; never read), and keys and short strings are shared between objects (half
the memory; `_shared`).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import kopf

from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import Resource
from dsv4_operator.names import DEPLOYMENT_LABEL
from dsv4_operator.runtime.kopf_streams import (
    APINotFoundError,
    Bookmark,
    NamespaceName,
    continuous_watch,
    kopf_resource,
    select_by_label,
    streaming_block,
)

log = logging.getLogger(__name__)
Objs = list[Obj]  # (the class below has a method named `list`)
Key = tuple[str, str]  # (namespace, name)


class Listener(Protocol):
    """Told of each version of an object the cache takes up, once: the kind, the object (its
    last state when deleted), whether it was deleted, and whether it came from the operator's
    own write (`observe`) rather than from a watch event."""

    def __call__(self, res: Resource, obj: Obj, deleted: bool, own: bool = False) -> None: ...


# Whether a kind's API is served (ServiceMonitor needs the prometheus-operator CRDs).
Discover = Callable[[Resource], Awaitable[bool]]
# Told of each LIST session a kind's stream starts, and of each failed stream (metrics).
Count = Callable[[Resource], None]

ERROR_BACKOFF_MAX = 60.0
# An optional kind that is not served is looked for again after 2 s, then twice as long each
# time, up to 300 s: a CRD installed with the operator (helm install) is often not yet in
# discovery when the operator starts, and waiting the whole 300 s left the first deployment's
# DSV4Model unreconciled for five minutes; a kind that never comes costs a request per 300 s.
ABSENT_FIRST_RECHECK_SECONDS = 2.0
ABSENT_RECHECK_SECONDS = 300.0
# Deletions remembered per kind (the newest), for `observe` (see `_Store.gone`).
TOMBSTONES_MAX = 4096


def absent_recheck(times: int) -> float:
    """Seconds until an absent optional kind is looked for again, after `times` looks that
    found it absent."""
    return min(ABSENT_FIRST_RECHECK_SECONDS * 2.0**times, ABSENT_RECHECK_SECONDS)


@dataclass(frozen=True)
class Watched:
    """One kind to keep in the cache."""

    resource: Resource
    label_selector: str | None = None  # applied by the API server
    optional: bool = False  # its API may be missing; then it is empty and checked again later
    # The fields of `spec` kept (None: all of it). Only for a kind whose every reader goes
    # through one view that names what it reads (a pod's: pods.POD_SPEC_FIELDS_READ).
    spec_fields: tuple[str, ...] | None = None


# Watch events that write an object into the cache (DELETED removes it; a list item has none).
WATCH_WRITES = frozenset({"ADDED", "MODIFIED"})


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _newer(candidate: str | None, cached: str | None) -> bool:
    """Whether `candidate` is a later resourceVersion than `cached`.

    resourceVersions are opaque; etcd's are integers, and only then are two compared. Two
    versions that are not both integers count as newer: the watch settles it right after.
    """
    if candidate is None or cached is None:
        return True
    if candidate.isdigit() and cached.isdigit():
        return int(candidate) > int(cached)
    return candidate != cached


def _older(candidate: str | None, cached: str | None) -> bool:
    """Whether `candidate` is an earlier resourceVersion than `cached` (integers only)."""
    if candidate is None or cached is None or not (candidate.isdigit() and cached.isdigit()):
        return False
    return int(candidate) < int(cached)


@dataclass
class _Store:
    """The objects of one kind, by key, with an index by owning DSV4Deployment."""

    objects: dict[Key, Obj] = field(default_factory=dict)
    by_owner: dict[Key, set[Key]] = field(default_factory=dict)
    # Deleted keys -> the deletion's resourceVersion. The reply to a write sent before a
    # deletion may reach `observe` after the watch delivered the deletion: it must not put
    # the object back, since no event would ever remove it again (a deleted DSV4Deployment
    # kept in the cache was reconciled on, and kept its DSV4Model in use).
    gone: OrderedDict[Key, str] = field(default_factory=OrderedDict)

    def bury(self, key: Key, version: str | None) -> None:
        if version is None:
            return
        self.gone[key] = version
        self.gone.move_to_end(key)
        while len(self.gone) > TOMBSTONES_MAX:
            self.gone.popitem(last=False)

    def buried_since(self, key: Key, version: str | None) -> bool:
        """Whether `key` was deleted at or after `version` (a reply older than its deletion)."""
        deleted = self.gone.get(key)
        return deleted is not None and not _newer(version, deleted)

    @staticmethod
    def _owner(obj: Obj) -> Key | None:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        owner = labels.get(DEPLOYMENT_LABEL)
        return (_key(obj)[0], owner) if owner else None

    def put(self, obj: Obj) -> Obj | None:
        key = _key(obj)
        self.gone.pop(key, None)  # here again (created since, or a relist has it)
        old = self.objects.get(key)
        if old is not None:
            self._unindex(key, old)
        self.objects[key] = obj
        owner = self._owner(obj)
        if owner is not None:
            self.by_owner.setdefault(owner, set()).add(key)
        return old

    def pop(self, key: Key) -> Obj | None:
        old = self.objects.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def _unindex(self, key: Key, obj: Obj) -> None:
        owner = self._owner(obj)
        if owner is not None and owner in self.by_owner:
            self.by_owner[owner].discard(key)
            if not self.by_owner[owner]:
                del self.by_owner[owner]


# Strings up to this long are shared between cached objects (see `_shared`); longer ones
# (a ControllerRevision's data, an annotation holding JSON) are rarely repeated.
SHARED_STRING_MAX = 64


def _trim(obj: Obj, res: Resource, spec_fields: tuple[str, ...] | None = None) -> Obj:
    """What the cache keeps of an object: a copy without `metadata.managedFields`, with only
    `spec_fields` of its spec when given (`Watched.spec_fields`), its keys and short strings
    shared with every other cached object (`_shared`)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    spec = obj.get("spec")
    if spec_fields is not None and isinstance(spec, dict):
        obj = {**obj, "spec": {k: v for k, v in spec.items() if k in spec_fields}}
    kept: Obj = _shared(obj)
    kept.setdefault("apiVersion", res.api_version)
    kept.setdefault("kind", res.kind)
    return kept


def _shared(value: Any) -> Any:
    """`value` rebuilt with every key and every short string interned.

    Each watch event is decoded on its own, so the same keys (`metadata`, `labels`, ...) and
    values (label values, images, condition types) were separate strings in every object: at
    100 deployments the cache held 286 KB of objects per deployment, a quarter of it keys.
    Shared, the same objects take half the memory, for about 0.1 ms per event."""
    if isinstance(value, dict):
        return {sys.intern(k): _shared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shared(v) for v in value]
    if isinstance(value, str) and len(value) <= SHARED_STRING_MAX:
        return sys.intern(value)
    return value


class WatchCache:
    """Keeps `watched` kinds in memory from kopf's watch streams; calls `listener` on changes.

    `namespaces`: the namespaces watched (one stream per kind and namespace), or None for
    cluster-wide streams. `discover(resource)` answers whether an optional kind's API is
    served; the cache asks it at start and, while it is not, `absent_recheck` apart.
    """

    def __init__(
        self,
        settings: kopf.OperatorSettings,
        watched: Sequence[Watched],
        namespaces: Sequence[str] | None,
        listener: Listener | None = None,
        discover: Discover | None = None,
        on_list: Count | None = None,
        on_watch_error: Count | None = None,
    ) -> None:
        self.settings = settings
        self.watched = list(watched)
        self.namespaces: list[str | None] = list(namespaces) if namespaces else [None]
        self.listener = listener
        self.discover = discover
        self.on_list, self.on_watch_error = on_list, on_watch_error
        self._stores: dict[Resource, _Store] = {w.resource: _Store() for w in self.watched}
        self._spec_fields = {w.resource: w.spec_fields for w in self.watched}
        for w in self.watched:
            if w.label_selector:
                select_by_label(settings, w.resource, w.label_selector)
        self._absent: set[Resource] = set()
        self._pending = {(w.resource, ns) for w in self.watched for ns in self.namespaces}
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.lists = 0  # LIST sessions started (the initial ones and every re-list)

    # --- reads ---------------------------------------------------------------------------

    async def get(self, res: Resource, namespace: str | None, name: str) -> Obj | None:
        return self._stores[res].objects.get((namespace or "", name))

    async def list(
        self, res: Resource, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> Objs:
        store = self._stores[res]
        wanted = dict(labels or {})
        owner = wanted.get(DEPLOYMENT_LABEL)
        if owner is not None and namespace is not None:
            keys: Iterable[Key] = sorted(store.by_owner.get((namespace, owner), ()))
            candidates = [store.objects[k] for k in keys]
        else:
            candidates = [o for k, o in sorted(store.objects.items()) if namespace in (None, k[0])]
        return [o for o in candidates if _matches(o, wanted)]

    async def serves(self, res: Resource) -> bool:
        """Whether `res` is served, as of the last discovery (optional kinds only are ever
        absent; they are looked for again, `absent_recheck` apart)."""
        return res not in self._absent

    def keys(self, res: Resource) -> builtins.list[Key]:
        return sorted(self._stores[res].objects)

    # --- writes the operator made --------------------------------------------------------

    def observe(self, obj: Obj) -> None:
        """Fold in an object the API server returned for the operator's own write."""
        res = next((r for r in self._stores if r.kind == obj.get("kind")), None)
        if res is None or not obj.get("metadata"):
            return
        store = self._stores[res]
        key = _key(obj)
        cached = store.objects.get(key)
        version = obj["metadata"].get("resourceVersion")
        if cached is None and store.buried_since(key, version):
            return  # the reply to a write made before a deletion the watch already brought
        if cached is None or _newer(version, cached["metadata"].get("resourceVersion")):
            kept = _trim(obj, res, self._spec_fields[res])
            store.put(kept)
            # The watch event of this version finds it here and tells no one, so the listener
            # hears of it now: another object's pass may depend on it (a DSV4Model a
            # deployment's pass created has its own pass, which nothing else would start).
            self._notify(res, kept, deleted=False, own=True)

    # --- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start one stream per kind and namespace (again after `close()`: the store stays,
        and each new list drops what it no longer holds)."""
        self._pending = {(w.resource, ns) for w in self.watched for ns in self.namespaces}
        self._synced.clear()
        for w in self.watched:
            for ns in self.namespaces:
                self._tasks.append(asyncio.create_task(self._run(w, ns), name=f"watch {w}"))

    async def wait_synced(self) -> None:
        """Until every stream has finished its first list (absent optional kinds count)."""
        if not self._pending:
            self._synced.set()
        await self._synced.wait()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    def _listed(self, res: Resource, ns: str | None) -> None:
        self._pending.discard((res, ns))
        if not self._pending:
            self._synced.set()

    async def _served(self, w: Watched) -> bool:
        if not w.optional or self.discover is None:
            return True
        served = await self.discover(w.resource)
        if served:
            self._absent.discard(w.resource)
        else:
            self._absent.add(w.resource)
        return served

    async def _run(self, w: Watched, ns: str | None) -> None:
        failures = absent = 0
        while True:
            try:
                if not await self._served(w):
                    self._listed(w.resource, ns)
                    await asyncio.sleep(absent_recheck(absent))
                    absent += 1
                    continue
                absent = 0
                await self._session(w, ns)
                failures = 0
                # The session ended: a 410 Gone or a broken list; the next one lists again.
                await asyncio.sleep(self.settings.watching.reconnect_backoff)
            except asyncio.CancelledError:
                raise
            except APINotFoundError:
                self._absent.add(w.resource)  # the kind went away (CRD deleted)
                self._listed(w.resource, ns)
                await asyncio.sleep(absent_recheck(absent))
                absent += 1
            except Exception as error:  # one broken stream must not stop the others
                failures += 1
                delay = min(2.0**failures, ERROR_BACKOFF_MAX)
                if self.on_watch_error is not None:
                    self.on_watch_error(w.resource)
                log.warning(
                    "watch of %s %s failed (%s: %s); again in %.0fs",
                    w.resource.plural,
                    f"in {ns}" if ns else "cluster-wide",
                    type(error).__name__,
                    error,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _session(self, w: Watched, ns: str | None) -> None:
        """One list, then watch until the stream ends; the list's end replaces the store."""
        res = w.resource
        kres = kopf_resource(res)
        namespace = NamespaceName(ns) if ns is not None else None
        listed: set[Key] = set()
        self.lists += 1
        if self.on_list is not None:
            self.on_list(res)
        async with streaming_block(resource=kres, namespace=namespace) as waiter:
            stream = continuous_watch(
                settings=self.settings,
                resource=kres,
                namespace=namespace,
                operator_pause_waiter=waiter,
            )
            async for event in stream:
                if event is Bookmark.LISTED:
                    self._replace(res, ns, listed)
                    self._listed(res, ns)
                    continue
                if isinstance(event, Bookmark) or event.get("type") == "BOOKMARK":
                    continue
                raw = event["object"]
                if event.get("type") in WATCH_WRITES and self._has_version(res, raw):
                    continue  # mostly the operator's own write, folded in from its reply
                obj = _trim(dict(raw), res, w.spec_fields)
                if event.get("type") is None:  # part of the list
                    listed.add(_key(obj))
                self.fold(res, event.get("type"), obj)

    def _has_version(self, res: Resource, obj: Mapping[str, Any]) -> bool:
        """Whether the cache already holds `obj`'s version or a later one (what `_put` would
        then drop), so the event is not copied and trimmed for nothing."""
        cached = self._stores[res].objects.get(_key(obj))
        if cached is None:
            return False
        version = obj["metadata"].get("resourceVersion")
        held = cached["metadata"].get("resourceVersion")
        return version == held or _older(version, held)

    def fold(self, res: Resource, event_type: str | None, obj: Obj) -> None:
        """Fold in one object a stream brought (`event_type` None: an item of a list)."""
        if event_type == "DELETED":
            self._remove(res, _key(obj), obj)
        else:
            self._put(res, obj)

    def _put(self, res: Resource, obj: Obj) -> None:
        store = self._stores[res]
        cached = store.objects.get(_key(obj))
        version = obj["metadata"].get("resourceVersion")
        if cached is not None and _older(version, cached["metadata"].get("resourceVersion")):
            # The operator's own later write, folded in by observe(), is already here: an
            # event the watch delivers late must not take the cache back to before it (the
            # next pass would write that status again).
            return
        old = store.put(obj)
        if old is None or old["metadata"].get("resourceVersion") != version:
            self._notify(res, obj, deleted=False)

    def _remove(self, res: Resource, key: Key, last: Obj) -> None:
        cached = self._stores[res].objects.get(key)
        if cached is not None and _older(
            last["metadata"].get("resourceVersion"), cached["metadata"].get("resourceVersion")
        ):
            return  # the deletion of an object the operator has created again since
        store = self._stores[res]
        if store.pop(key) is not None:
            store.bury(key, last["metadata"].get("resourceVersion"))
            self._notify(res, last, deleted=True)

    def _replace(self, res: Resource, ns: str | None, listed: set[Key]) -> None:
        """After a (re-)list: what the list lacks was deleted while no watch was running."""
        store = self._stores[res]
        gone = [k for k in store.objects if k not in listed and ns in (None, k[0])]
        for key in gone:
            self._remove(res, key, store.objects[key])

    def _notify(self, res: Resource, obj: Obj, deleted: bool, own: bool = False) -> None:
        if self.listener is None:
            return
        try:
            self.listener(res, obj, deleted, own)
        except Exception:  # a listener bug must not stop the stream
            log.exception("cache listener failed for %s %s", res.kind, _key(obj))


def _matches(obj: Obj, wanted: Mapping[str, str]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())

"""Reading the engines (I/O): every running engine pod's /metrics each round and, once per pod,
its /server_info, at the pod's IP and the engine port, with the taps' client rules (no
proxy, a short timeout, one shared client).

A pod's new counts go to the revision on its label: an engine pod runs one revision all its
life, so what it counts is that revision's, whenever it is read. What the counts mean is the
guard's (guard/engine.py); what /server_info must say is the plan check's (guard/plan.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import httpx

from dsv4_operator.api.limits import ENGINE_PORT
from dsv4_operator.api.roles import ROLES
from dsv4_operator.guard.engine import EngineCounts, engine_counts, parse_engine_counts
from dsv4_operator.guard.observations import Key
from dsv4_operator.guard.plan import ServerInfo
from dsv4_operator.guard.taps import TrafficDeltas
from dsv4_operator.names import LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL
from dsv4_operator.pods import PodView
from dsv4_operator.signals.http import Pages
from dsv4_operator.signals.taps import TAP_SCRAPE_TIMEOUT, pod_url, scrape

# Not /get_server_info: every supported release (0.5.16, 0.5.23) marks it deprecated, logs a
# warning per call and answers with /server_info's reply (docs/engine-notes.md).
SERVER_INFO_PATH = "/server_info"


async def read_server_info(pages: Pages, url: str) -> ServerInfo | None:
    """What the engine reports of itself, None until it answers with a JSON object."""
    try:
        body = json.loads(await pages.text(url, TAP_SCRAPE_TIMEOUT))
    except (httpx.HTTPError, ValueError):
        return None
    return ServerInfo.of(body) if isinstance(body, dict) else None


def http_up(pods: Sequence[PodView]) -> set[str]:
    """The uids of the engine pods whose HTTP server is up, as far as readiness tells: a Ready
    pod, and a multi-node group's worker whose leader is Ready.

    An engine opens its HTTP port only once its weights are loaded, minutes for DSV4, and its
    readiness probe passes soon after. A worker has no probe of its own (render/groups.py): it
    opens a health-only server (/metrics among its pages) once its ranks have joined the
    group's, which is when its leader can answer (docs/engine-notes.md, "Start-up")."""
    leaders_ready = {_group(p) for p in pods if p.worker_index == 0 and p.ready}
    return {
        p.uid
        for p in pods
        if p.uid and (p.ready if p.worker_index == 0 else _group(p) in leaders_ready)
    }


def restarts(pod: PodView) -> int:
    """How many times the kubelet has restarted the pod's containers in place."""
    return sum(container.restart_count for container in pod.containers)


def restart_note(pod: PodView) -> str:
    """`name: restarted in place (restarts N; last exit R, code C; waiting W)`, for the log."""
    parts = [f"restarts {restarts(pod)}"]
    last = next((c.last_terminated for c in pod.containers if c.last_terminated), None)
    if last is not None:
        parts.append(f"last exit {last.reason or 'unknown'}, code {last.exit_code}")
    waiting = next((c.waiting for c in pod.containers if c.waiting), None)
    if waiting is not None and waiting.reason:
        parts.append(f"waiting {waiting.reason}")
    return f"{pod.name}: restarted in place ({'; '.join(parts)})"


def _group(pod: PodView) -> tuple[str | None, str | None]:
    """Its multi-node group: (LeaderWorkerSet, group index), from the LWS controller's labels."""
    return pod.labels.get(LWS_NAME_LABEL), pod.labels.get(LWS_GROUP_INDEX_LABEL)


@dataclass
class EngineRound:
    """One round over a deployment's engine pods: new counts per revision, the revisions that
    have pods, each pod's server info, the pods that could not be read, the pods not read
    because their engine restarted in place and is not Ready again (`restart_note`), and
    whether the pods changed (one came, went, or is on its way: not running yet, loading,
    or restarting)."""

    counts: dict[str, EngineCounts] = field(default_factory=dict)
    revisions: set[str] = field(default_factory=set)
    server_info: dict[str, ServerInfo] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    restarting: list[str] = field(default_factory=list)
    pods_changed: bool = False


class EngineReader:
    """Counter baselines per pod uid and the server-info cache, across rounds."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self._deltas = TrafficDeltas()
        self._infos: dict[Key, dict[str, ServerInfo]] = {}
        self._restarts: dict[Key, dict[str, int]] = {}  # per pod uid, when it last answered

    def forget(self, key: Key) -> None:
        self._deltas.retain(key, set())
        self._infos.pop(key, None)
        self._restarts.pop(key, None)

    async def round(self, key: Key, pods: list[PodView], started: datetime) -> EngineRound:
        """Read every running engine pod of `key` (with an IP, a uid and a revision) whose
        HTTP server is up (`http_up`) or that answered before, unless it restarted in place
        since it last answered and is not up again; a restarted group worker that fails to
        answer counts as restarting too. A pod created after `started` (when this loop began)
        is counted from zero."""
        running = [
            p
            for p in pods
            if p.role in ROLES and p.phase == "Running" and p.ip and p.uid and p.revision
        ]
        up = http_up(pods)
        answered = self._restarts.setdefault(key, {})
        # Not up and never read: still loading, a read would only be refused. Read before and
        # restarted in place since (its containers' restarts up): reloading, not read while not
        # up; a group's worker, "up" by its leader's readiness with no probe of its own, is read
        # and a failure is its restart. Read before and not up otherwise, or restarted and Ready
        # again by its own probe: read, a failure to answer is news.
        known = {str(p.uid) for p in running if self._deltas.knows(key, str(p.uid))}
        restarted = {
            p.uid for p in running if p.uid in known and restarts(p) > answered.get(str(p.uid), 0)
        }
        restarting = [p for p in running if p.uid in restarted and p.uid not in up]
        engines = [p for p in running if p.uid in up or (p.uid in known and p.uid not in restarted)]
        loading = len(engines) + len(restarting) < len(running)
        kept = {str(p.uid) for p in (*engines, *restarting)}  # their baselines kept
        came_or_went = self._deltas.retain(key, kept)
        infos = {u: i for u, i in self._infos.get(key, {}).items() if u in kept}
        self._infos[key] = infos
        self._restarts[key] = answered = {u: n for u, n in answered.items() if u in kept}
        # On its way: pending, running without an address yet, loading or restarting (a failed
        # or evicted pod that lingers is not).
        coming = (
            loading
            or bool(restarting)
            or any(
                p.role in ROLES and (p.phase == "Pending" or (p.phase == "Running" and not p.ip))
                for p in pods
            )
        )
        out = EngineRound(
            revisions={str(p.revision) for p in (*engines, *restarting)},
            restarting=[restart_note(p) for p in restarting],
            pods_changed=came_or_went or coming,
        )
        replies = await asyncio.gather(*(self._read(p, str(p.uid) in infos) for p in engines))
        for pod, (counts, error, info) in zip(engines, replies, strict=True):
            uid, revision = str(pod.uid), str(pod.revision)
            if info is not None:
                infos[uid] = info
            if error is not None:
                if pod.uid in restarted and pod.worker_index > 0:
                    out.restarting.append(restart_note(pod))
                else:
                    out.failed.append(f"{pod.name}: {error}")
                continue
            answered[uid] = restarts(pod)
            fresh = pod.created is not None and pod.created.at > started
            new = self._deltas.advance((key, uid), counts, fresh=fresh)
            got = engine_counts(new, decode=pod.role == "decode")
            if got:
                out.counts[revision] = out.counts.get(revision, EngineCounts()) + got
        out.server_info = dict(infos)
        return out

    async def _read(
        self, pod: PodView, known: bool
    ) -> tuple[dict[str, float], str | None, ServerInfo | None]:
        ip = str(pod.ip)
        counts, error = await scrape(
            self.pages, pod_url(ip, ENGINE_PORT, "/metrics"), parse_engine_counts
        )
        # At most once per pod: its server info does not change while it runs. A group's
        # worker has none: its health-only server answers /metrics and the health checks.
        info = (
            None
            if known or error is not None or pod.worker_index > 0
            else await read_server_info(self.pages, pod_url(ip, ENGINE_PORT, SERVER_INFO_PATH))
        )
        return counts, error, info

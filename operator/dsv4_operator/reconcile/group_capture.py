"""Group restarts as the watch saw them, kept in memory until a pass has them in status.

A LeaderWorkerSet with `RecreateGroupOnPodRestart` deletes a group as soon as one of its
containers restarted, often before any reconcile pass lists the pods: a pass that sees only the
recreated group would never learn of the restart. The watch cache sees every state of every
pod in order, so each Pod event is folded in here (`saw`): the first state with a restarted
container opens a restart of its group, snapshotting every pod of the group as last seen; the
later states of the same pods (terminated by the group's deletion, their DELETED event) keep
each pod's last termination up to date. The pass reads what is not in status yet (`pending`);
what status holds is dropped then. A re-list after a broken watch delivers only the end state:
a restart the API server had already cleaned up by then stays unseen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dsv4_operator.api.status import GroupRestart, PodTermination
from dsv4_operator.names import DEPLOYMENT_LABEL
from dsv4_operator.pods import PodView
from dsv4_operator.reconcile.groups import (
    MAX_GROUP_RESTARTS,
    groups_of,
    last_termination,
    new_group_restarts,
)

Key = tuple[str, str]  # (namespace, DSV4Deployment name)


@dataclass
class _Open:
    """A restart not in status yet, and which pod (by uid) each of its entries is."""

    restart: GroupRestart
    uids: dict[str, int]  # pod uid -> index in restart.pods


@dataclass
class _Deployment:
    members: dict[str, dict[str, PodView]] = field(default_factory=dict)  # group -> uid -> pod
    open: dict[str, _Open] = field(default_factory=dict)  # restart key -> restart
    # Keys status already holds: a later event of the same pod must not open them again.
    closed: dict[str, None] = field(default_factory=dict)


def _group(pod: PodView) -> str | None:
    return next(iter(groups_of([pod])), None)


class GroupRestartCapture:
    """Per deployment: the live pods of each group and the restarts no pass recorded yet."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.clock = clock
        self._deployments: dict[Key, _Deployment] = {}

    def saw(self, pod: Mapping[str, Any], deleted: bool) -> None:
        """Fold in one watch event of a pod (its last state when `deleted`)."""
        meta = pod.get("metadata") or {}
        owner = (meta.get("labels") or {}).get(DEPLOYMENT_LABEL)
        view = PodView.of(pod)
        group = _group(view)
        if not owner or group is None or view.uid is None:
            return
        state = self._deployments.setdefault((meta.get("namespace") or "", owner), _Deployment())
        members = state.members.setdefault(group, {})
        members[view.uid] = view
        for entry in state.open.values():
            index = entry.uids.get(view.uid)
            if index is not None and _said(view):
                entry.restart.pods[index] = last_termination(view)
        known = [entry.restart for entry in state.open.values()]
        for restart in new_group_restarts(members.values(), known, self.clock()):
            if restart.key in state.closed:
                continue
            ordered = groups_of(members.values())[group]
            uids = {p.uid: i for i, p in enumerate(ordered) if p.uid is not None}
            state.open[restart.key] = _Open(restart, uids)
        while len(state.open) > MAX_GROUP_RESTARTS:
            state.open.pop(next(iter(state.open)))  # the oldest
        if deleted:
            del members[view.uid]
            if not members:
                del state.members[group]

    def pending(self, key: Key, recorded: Iterable[str]) -> tuple[GroupRestart, ...]:
        """The restarts of deployment `key` whose keys are not in `recorded` (its status),
        oldest first; those in status are dropped."""
        state = self._deployments.get(key)
        if state is None:
            return ()
        for done in set(recorded) & set(state.open):
            del state.open[done]
            state.closed[done] = None
        while len(state.closed) > 4 * MAX_GROUP_RESTARTS:
            state.closed.pop(next(iter(state.closed)))
        return tuple(entry.restart.model_copy(deep=True) for entry in state.open.values())

    def forget(self, key: Key) -> None:
        """The deployment is gone."""
        self._deployments.pop(key, None)


def _said(pod: PodView) -> bool:
    """Whether the pod holds a termination worth keeping (a terminated or restarted container)."""
    termination: PodTermination = last_termination(pod)
    return termination.reason is not None or termination.exit_code is not None

"""Posts the operator's Events, aggregated: a repeat bumps `count` and `lastTimestamp`.

The same rule as client-go's event correlator: an Event with the same object, type, reason
and message as one posted before (remembered in memory, bounded) is not created again; its
count goes up. A remembered Event that expired (the API server keeps Events for an hour) is
created anew. Failures are logged, never fatal: an Event is a courtesy, not state.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from dsv4_operator import metrics
from dsv4_operator.events import Note
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import KubeError, NotFound
from dsv4_operator.kube.resources import DSV4, EVENT
from dsv4_operator.names import OPERATOR, format_time

log = logging.getLogger(__name__)
REPORTING_COMPONENT = OPERATOR
REMEMBERED_EVENTS = 4096
MESSAGE_LIMIT = 1024


@dataclass(frozen=True)
class Subject:
    """The object an Event is about: a DSV4Deployment, or (kind) a DSV4Model."""

    namespace: str
    name: str
    uid: str
    kind: str = DSV4.kind


@dataclass
class _Posted:
    name: str
    count: int


class EventRecorder:
    """Creates or aggregates core/v1 Events on DSV4Deployments."""

    def __init__(self, client: KubeClient, remember: int = REMEMBERED_EVENTS) -> None:
        self.client = client
        self.remember = remember
        self._posted: OrderedDict[tuple[str, str, str, str, str], _Posted] = OrderedDict()

    async def post(self, subject: Subject, note: Note, now: datetime) -> None:
        message = note.message[:MESSAGE_LIMIT]
        key = (subject.namespace, subject.uid, note.type, note.reason, message)
        stamp = format_time(now)
        try:
            posted = self._posted.get(key)
            if posted is not None:
                try:
                    await self.client.merge_patch(
                        EVENT,
                        subject.namespace,
                        posted.name,
                        {"count": posted.count + 1, "lastTimestamp": stamp},
                    )
                    posted.count += 1
                    self._posted.move_to_end(key)
                    metrics.EVENTS_POSTED.labels("aggregated").inc()
                    return
                except NotFound:
                    del self._posted[key]  # expired: post it anew
            created = await self.client.create(
                _event(subject, note.type, note.reason, message, stamp)
            )
            self._posted[key] = _Posted(created["metadata"]["name"], 1)
            while len(self._posted) > self.remember:
                self._posted.popitem(last=False)
            metrics.EVENTS_POSTED.labels("created").inc()
        except KubeError as error:
            log.warning(
                "could not post event %s on %s/%s: %s",
                note.reason,
                subject.namespace,
                subject.name,
                error,
            )


def _event(
    subject: Subject, type_: str, reason: str, message: str, stamp: str
) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{subject.name}.", "namespace": subject.namespace},
        "involvedObject": {
            "apiVersion": DSV4.api_version,
            "kind": subject.kind,
            "name": subject.name,
            "namespace": subject.namespace,
            "uid": subject.uid,
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": REPORTING_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }

"""A Kubernetes Event the operator posts about a DSV4Deployment (what decide() and the guard
say happened; reconcile/act.py posts them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Note:
    """A Kubernetes Event to post about the owner."""

    type: EventType
    reason: str
    message: str
    # The revision the Event is about, when it is one's (not posted: decide() joins the
    # Events of one step by it).
    revision: str | None = None

"""Optional reads the operator's RBAC refused, per namespace: not asked again for a while, then
asked again, so that a grant added later (a chart upgrade, an admin's Role) takes effect
without a restart."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

# Long enough that a namespace whose RBAC refuses a read costs one refused request (and one
# log line) per period, short enough that a fixed Role is picked up within minutes.
RETRY_SECONDS = 600.0
log = logging.getLogger(__name__)


class Refusals:
    """When each (read, namespace) was last refused; a refusal holds for `retry_seconds`.

    Per namespace because RBAC is: with `watchNamespaces` the chart grants a Role in each
    namespace, and one namespace's missing rule says nothing of another's."""

    def __init__(self, clock: Callable[[], datetime], retry_seconds: float = RETRY_SECONDS) -> None:
        self._clock = clock
        self.retry = timedelta(seconds=retry_seconds)
        self._until: dict[tuple[str, str], datetime] = {}

    def holds(self, read: str, namespace: str) -> bool:
        """Whether `read` was refused in `namespace` within the retry period (then it is not
        asked for)."""
        until = self._until.get((read, namespace))
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._until[(read, namespace)]  # due to be asked again
        return False

    def refused(self, read: str, namespace: str, meanwhile: str) -> None:
        """The API server refused `read` in `namespace` (403) just now; logged once per
        period with what the operator does `meanwhile`."""
        self._until[(read, namespace)] = self._clock() + self.retry
        log.warning(
            "cannot %s (RBAC) in namespace %s: %s; asking again in %.0fs",
            read,
            namespace,
            meanwhile,
            self.retry.total_seconds(),
        )

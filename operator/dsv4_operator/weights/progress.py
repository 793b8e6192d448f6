"""What the weights fetcher reports on its Job, and how its failures are named and exit.

The fetcher (``python -m dsv4_operator.weights``) runs in a Job pod; it writes a
:class:`WeightsProgress` as JSON into the Job's :data:`PROGRESS_ANNOTATION` while it works, and
exits with the code of its failure :class:`FailureReason`. The Job's podFailurePolicy fails the
Job at once on the codes no retry can fix (:data:`PERMANENT_EXIT_CODES`); any other exit is
retried by the Job controller, and the next pod resumes where the last one stopped.
"""

from __future__ import annotations

import enum
import json
from typing import Literal

from pydantic import Field, ValidationError

from dsv4_operator.api.base import ApiModel
from dsv4_operator.names import LABEL_PREFIX
from dsv4_operator.reasons import WeightsReason

PROGRESS_ANNOTATION = f"weights.{LABEL_PREFIX}/progress"

Phase = Literal["Planning", "Downloading", "Verifying", "Complete", "Failed"]


class FailureReason(enum.Enum):
    """Why a fetch failed, with the exit code the Job's podFailurePolicy matches on."""

    UNAUTHORIZED = (WeightsReason.UNAUTHORIZED, 3, True)
    NOT_FOUND = (WeightsReason.NOT_FOUND, 4, True)
    DISK_FULL = (WeightsReason.DISK_FULL, 5, True)
    VERIFY_FAILED = (WeightsReason.VERIFY_FAILED, 6, True)
    HUB_UNAVAILABLE = (WeightsReason.HUB_UNAVAILABLE, 1, False)

    def __init__(self, reason: WeightsReason, exit_code: int, permanent: bool) -> None:
        self.reason = reason
        self.exit_code = exit_code
        self.permanent = permanent


PERMANENT_EXIT_CODES = sorted(r.exit_code for r in FailureReason if r.permanent)


class WeightsProgress(ApiModel):
    """One report of the fetcher (the Job annotation's value)."""

    phase: Phase
    repo: str
    revision: str
    commit: str | None = Field(default=None, description="The commit the revision resolved to.")
    files_done: int = 0
    files_total: int | None = None
    bytes_done: int = 0
    bytes_total: int | None = None
    reason: str | None = Field(default=None, description="FailureReason.reason when Failed.")
    message: str | None = None

    def to_annotation(self) -> str:
        return json.dumps(self.to_wire(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str | None) -> WeightsProgress | None:
        """The report, or None when there is none or it does not parse (treated as none)."""
        if not text:
            return None
        try:
            return cls.model_validate_json(text)
        except ValidationError:
            return None

    def summary(self) -> str:
        """`3/170 files, 12.3/700.0 GiB` (what is known so far)."""
        parts = []
        if self.files_total is not None:
            parts.append(f"{self.files_done}/{self.files_total} files")
        if self.bytes_total is not None:
            parts.append(_sizes(self.bytes_done, self.bytes_total))
        return ", ".join(parts) or "size not known yet"


def _sizes(done: int, total: int) -> str:
    """`12.3/700.0 GiB`, in the unit that suits the total."""
    shift, unit = (30, "GiB") if total >= 1 << 30 else (20, "MiB")
    return f"{done / (1 << shift):.1f}/{total / (1 << shift):.1f} {unit}"

"""A small exception tree for Kubernetes API calls (status code -> class)."""

from __future__ import annotations


class KubeError(Exception):
    """Any failed API call; `status` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    """404: the object (or its type) does not exist."""


class Conflict(KubeError):
    """409: resourceVersion conflict, or an apply field conflict."""


class Invalid(KubeError):
    """422: the API server (schema, CEL, admission) refused the object."""


class Forbidden(KubeError):
    """403: RBAC does not allow the call."""


class Unreachable(KubeError):
    """The transport failed (connection refused, timeout)."""


_BY_STATUS: dict[int, type[KubeError]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
}


def error_for(status: int, reason: str, message: str) -> KubeError:
    return _BY_STATUS.get(status, KubeError)(status, reason, message)


def refused(error: KubeError) -> bool:
    """The API server refused the object itself (validation, an admission policy, a field its
    schema does not declare), rather than failing to serve the request. Server-side apply
    reports an undeclared field as a 500 ("failed to create typed patch object")."""
    return error.status in (400, 422) or (
        error.status == 500 and "failed to create typed patch object" in error.message
    )

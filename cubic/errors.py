"""cubic's exception hierarchy.

Every layer raises these instead of library exceptions so that the service can map them to
HTTP statuses in one place (``status_code``) and callers can catch one family.
"""

from __future__ import annotations


class CubicError(Exception):
    """Base of every error cubic raises on purpose."""

    status_code: int = 500


class NotFound(CubicError):
    """A study, trial or model that was asked for does not exist."""

    status_code = 404


class Conflict(CubicError):
    """The request is valid but clashes with the current state of the resource."""

    status_code = 409


class LeaseLost(Conflict):
    """The caller no longer holds the trial's lease (stale token, released or reaped)."""


class TrialFinished(Conflict):
    """The trial is already finished, and a finished trial never changes."""


class InvalidInput(CubicError):
    """An argument is malformed or out of range; retrying the same call cannot succeed.

    ``field`` names the offending input (a dotted path such as ``"space.tp"``) when known, so
    an API response can point at it.
    """

    status_code = 422

    def __init__(self, message: str = "", *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SchemaOutOfDate(CubicError):
    """The database schema does not match this version of cubic.

    Raised at start-up instead of migrating implicitly: migrations are an explicit step.
    """

    status_code = 503


class StorageError(CubicError):
    """The database failed (connection lost, lock timeout, constraint violated).

    Wraps the SQLAlchemy error, which stays available as ``__cause__``.
    """

    status_code = 503


class Unauthorized(CubicError):
    """No valid API token came with the request (missing, unknown or revoked)."""

    status_code = 401


class Forbidden(CubicError):
    """The token is valid, but its role or its study does not allow this."""

    status_code = 403

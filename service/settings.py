"""The service's settings: cubic's own (``CUBIC_DATABASE_URL``...) plus the API's knobs.

Read from the environment (``CUBIC_*``) once, when the app is built, and validated then: a bad
value stops the start-up with a message naming the variable instead of failing on a request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from cubic.config import Settings
from cubic.errors import InvalidInput


class ServiceSettings(Settings):
    """What the API needs on top of :class:`cubic.config.Settings`.

    ``CUBIC_REAP_INTERVAL_S``: how often expired leases are turned into failed trials.
    ``CUBIC_RETRAIN_EVERY``: new finished trials of a workload kind before its proxy model
    is refitted; ``CUBIC_RETRAIN_INTERVAL_S``: how often the retrainer looks;
    ``CUBIC_RETRAIN_MAX_SHARE``: the most of a core those shared refits take on average
    (after a fit of d seconds the next waits until d / share after it began).
    ``CUBIC_DEFAULT_LEASE_S``: the lease length when a worker does not name one.
    ``CUBIC_MAX_PAGE_SIZE``: the largest ``limit`` a list endpoint accepts.
    ``CUBIC_SPACES_DIR``: where a submitted spec's ``space:`` file name is looked up
    (then among the spaces cubic ships; nowhere else).
    ``CUBIC_DB_POOL_SIZE`` / ``CUBIC_DB_MAX_OVERFLOW``: database connections per process.
    ``CUBIC_AUTH``: whether requests need an API token (on unless turned off; ``cubic
    serve`` turns it off when it listens on loopback only, and says so).
    ``CUBIC_MAX_BODY_BYTES``: the largest request body any endpoint reads (413 beyond).
    ``CUBIC_LOG_LEVEL``: what the service logs of its own work (refits, reaped leases...).
    ``CUBIC_BACKGROUND``: where proposing and model fitting run: ``process`` (a process of
    their own beside each API process, so that their CPU work never holds the interpreter
    lock a request waits on) or ``thread`` (threads of the API process: one process in all,
    for tests and small machines).
    ``CUBIC_BACKGROUND_NICE``: how much lower than its API process's the CPU priority of the
    background process's model fits is (a Unix nice increment, 0-19; on Linux, where a
    thread has a priority of its own): fits take the cores the requests and the proposals
    leave, so that a lease or a report never waits for a core behind a fit. Proposing runs
    at the requests' priority: a lease that finds no trial waiting leaves a GPU idle.
    """

    reap_interval_s: float = Field(5.0, gt=0, le=3600)
    retrain_every: int = Field(8, ge=1, le=100_000)
    retrain_interval_s: float = Field(5.0, gt=0, le=3600)
    retrain_max_share: float = Field(0.01, gt=0, le=1)
    default_lease_s: float = Field(300.0, ge=1, le=86400)
    max_page_size: int = Field(500, ge=1, le=100_000)
    spaces_dir: Path = Path("search_spaces")
    db_pool_size: int = Field(10, ge=1, le=1000)
    db_max_overflow: int = Field(20, ge=0, le=1000)
    auth: bool = True
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=1024**3)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    background: Literal["process", "thread"] = "process"
    background_nice: int = Field(10, ge=0, le=19)

    @classmethod
    def from_env(cls, **overrides: object) -> ServiceSettings:
        """Read the environment; a bad value raises :class:`InvalidInput` naming the variable."""
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise settings_error(exc) from exc

    @classmethod
    def of(cls, settings: Settings | None) -> ServiceSettings:
        """Service settings from cubic's (what ``cubic serve`` passes), the rest from the env."""
        if settings is None:
            return cls.from_env()
        if isinstance(settings, ServiceSettings):
            return settings
        return cls.from_env(**settings.model_dump())


def settings_error(exc: ValidationError) -> InvalidInput:
    """One line per bad variable, named as the user sets it (``CUBIC_REAP_INTERVAL_S``)."""
    parts = []
    for err in exc.errors():
        name = "CUBIC_" + "_".join(str(p) for p in err["loc"]).upper()
        parts.append(f"{name}: {err['msg']}")
    first = exc.errors()[0]["loc"] if exc.errors() else ()
    field = "CUBIC_" + "_".join(str(p) for p in first).upper() if first else None
    return InvalidInput("invalid settings: " + "; ".join(parts), field=field)

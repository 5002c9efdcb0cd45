"""Settings read from the environment (``CUBIC_*``), validated once at start-up."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cubic.retry import INTERACTIVE_OUTAGE_S


class Settings(BaseSettings):
    """Where cubic keeps its data.

    ``CUBIC_DATABASE_URL``: a SQLAlchemy URL; SQLite (a file) by default, PostgreSQL with
    ``postgresql+psycopg://user@host:5432/db``.
    """

    model_config = SettingsConfigDict(env_prefix="CUBIC_", extra="ignore")

    database_url: str = Field("sqlite:///cubic.db")

    @field_validator("database_url")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if not v.startswith(("sqlite:", "postgresql")):
            raise ValueError("CUBIC_DATABASE_URL must be a sqlite:// or postgresql:// URL")
        return v


class ClientSettings(BaseSettings):
    """What a command a person waits on reads from the environment.

    ``CUBIC_OUTAGE_S``: seconds to ride through an unreachable service before giving up
    (a worker's ``--outage-s`` reads the same variable, with its own longer default).
    """

    model_config = SettingsConfigDict(env_prefix="CUBIC_", extra="ignore")

    outage_s: float = Field(INTERACTIVE_OUTAGE_S, ge=0, allow_inf_nan=False)

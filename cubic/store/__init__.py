"""cubic's storage: SQL tables, migrations, and the :class:`Store` repository.

Everything outside this package reaches the database through :class:`Store`, which returns
the immutable objects defined in :mod:`cubic.store.objects`.
"""

from __future__ import annotations

from cubic.store.engine import DEFAULT_URL, make_engine
from cubic.store.objects import (
    TRIAL_SOURCES,
    ProxyModelVersion,
    Study,
    StudyCounts,
    StudyState,
    Trial,
    TrialEvent,
    TrialState,
)
from cubic.store.repository import LEASE_EXPIRED, Store
from cubic.store.schema import check_schema, current_revision, downgrade, head_revision, upgrade

__all__ = [
    "DEFAULT_URL",
    "LEASE_EXPIRED",
    "TRIAL_SOURCES",
    "ProxyModelVersion",
    "Store",
    "Study",
    "StudyCounts",
    "StudyState",
    "Trial",
    "TrialEvent",
    "TrialState",
    "check_schema",
    "current_revision",
    "downgrade",
    "head_revision",
    "make_engine",
    "upgrade",
]

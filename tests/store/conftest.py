"""The store tests' fixtures, also available here when run without ``tests/conftest.py``."""

from __future__ import annotations

from tests.store.backends import db_url, store

__all__ = ["db_url", "store"]

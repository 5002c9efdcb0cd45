"""Fixtures shared by every test folder: a store over SQLite, and over PostgreSQL when set."""

from __future__ import annotations

pytest_plugins = ["tests.store.backends"]

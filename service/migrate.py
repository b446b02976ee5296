"""Applies migrations/*.sql in order with yoyo; safe to run again (applied files are recorded).

Then, on every run, the repeatable files of migrations/repeatable/ (the billing rules: CREATE OR
REPLACE functions), in name order, in one transaction: procrastinate keeps its current schema.sql
beside its versioned migrations the same way. They are applied after the versioned migrations
because they may use what those create, and every time because re-applying an unchanged function is
harmless while a changed one must replace the old. They sit next to the versioned files so that
they ship with them, wherever those are packaged.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from yoyo import get_backend, read_migrations

from service.config import shipped

MIGRATIONS_DIR = shipped("migrations")
REPEATABLE_DIR = MIGRATIONS_DIR / "repeatable"
# Serialises concurrent `migrate` runs over the repeatable files (hex-packed ASCII 'qlrepeat';
# see service.quota.reset.RESET_LOCK_KEY for the registry of fixed keys).
REPEATABLE_LOCK_KEY = 0x716C_7265_7065_6174


class NoMigrations(RuntimeError):
    """No migration was found: an install that lost them must not report an empty database as up to
    date."""


def yoyo_url(database_url: str) -> str:
    """yoyo picks its driver from the scheme; psycopg 3 is `postgresql+psycopg`."""
    scheme, sep, rest = database_url.partition("://")
    return f"postgresql+psycopg://{rest}" if sep and scheme in ("postgres", "postgresql") else database_url


def repeatable_files() -> list[Path]:
    return sorted(REPEATABLE_DIR.glob("*.sql"))


def apply_repeatable(database_url: str) -> list[str]:
    """Apply every repeatable file, in one transaction; returns their names."""
    files = repeatable_files()
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (REPEATABLE_LOCK_KEY,))
        for path in files:
            conn.execute(path.read_text())  # a trusted file of ours, with no parameters
    return [p.name for p in files]


def migrate(database_url: str) -> list[str]:
    """Apply every pending migration, then the repeatable files; returns the ids applied now. Raises
    NoMigrations when there are none to read."""
    migrations = read_migrations(str(MIGRATIONS_DIR)) if MIGRATIONS_DIR.is_dir() else []
    if not migrations:
        raise NoMigrations(f"no migration found in {MIGRATIONS_DIR}")
    backend = get_backend(yoyo_url(database_url))
    try:
        with backend.lock():
            pending = backend.to_apply(migrations)
            backend.apply_migrations(pending)
    finally:
        backend.connection.close()  # an open session would block CREATE DATABASE ... TEMPLATE
    apply_repeatable(database_url)
    return [m.id for m in pending]

"""Applies migrations/*.sql in order with yoyo; safe to run again (applied files are recorded)."""

from __future__ import annotations

from pathlib import Path

from yoyo import get_backend, read_migrations

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def yoyo_url(database_url: str) -> str:
    """yoyo picks its driver from the scheme; psycopg 3 is `postgresql+psycopg`."""
    scheme, sep, rest = database_url.partition("://")
    return f"postgresql+psycopg://{rest}" if sep and scheme in ("postgres", "postgresql") else database_url


def migrate(database_url: str) -> list[str]:
    """Apply every pending migration; returns the ids applied now."""
    backend = get_backend(yoyo_url(database_url))
    migrations = read_migrations(str(MIGRATIONS_DIR))
    try:
        with backend.lock():
            pending = backend.to_apply(migrations)
            backend.apply_migrations(pending)
    finally:
        backend.connection.close()  # an open session would block CREATE DATABASE ... TEMPLATE
    return [m.id for m in pending]

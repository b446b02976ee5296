"""Applies migrations/*.sql in order with yoyo; safe to run again (applied files are recorded)."""

from __future__ import annotations

from yoyo import get_backend, read_migrations

from service.config import shipped

MIGRATIONS_DIR = shipped("migrations")


class NoMigrations(RuntimeError):
    """No migration was found: an install that lost them must not report an empty database as up to
    date."""


def yoyo_url(database_url: str) -> str:
    """yoyo picks its driver from the scheme; psycopg 3 is `postgresql+psycopg`."""
    scheme, sep, rest = database_url.partition("://")
    return f"postgresql+psycopg://{rest}" if sep and scheme in ("postgres", "postgresql") else database_url


def migrate(database_url: str) -> list[str]:
    """Apply every pending migration; returns the ids applied now. Raises NoMigrations when there
    are none to read."""
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
    return [m.id for m in pending]

"""Migrations apply to an empty database, and running them again is a no-op."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

from service.migrate import MIGRATIONS_DIR, migrate

TABLES = {"accounts", "quotas", "ledger", "api_keys", "audit_log"}


def _tables(url):
    with psycopg.connect(url) as c:
        rows = c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


def test_migrate_an_empty_database_then_again_is_a_no_op(empty_db):
    assert not TABLES & _tables(empty_db)
    every = sorted(p.stem for p in Path(MIGRATIONS_DIR).glob("*.sql") if not p.stem.endswith(".rollback"))

    assert migrate(empty_db) == every
    tables = _tables(empty_db)
    assert tables >= TABLES

    assert migrate(empty_db) == []
    assert _tables(empty_db) == tables


def test_migrate_command(empty_db):
    env = {**os.environ, "DATABASE_URL": empty_db}
    cmd = [sys.executable, "-m", "service.cli", "migrate"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("applied: ")
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "database is up to date"

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


def test_the_repeatable_rules_are_applied_on_every_run(empty_db):
    migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as c:
        # an outdated definition, as a database migrated by an older release would hold
        c.execute(
            "CREATE OR REPLACE FUNCTION billing_keeps_access(status text) RETURNS boolean"
            " LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT false $$"
        )
    assert migrate(empty_db) == []  # no versioned migration pending, the rules applied anyway
    with psycopg.connect(empty_db, autocommit=True) as c:
        assert c.execute("SELECT billing_keeps_access('active')").fetchone() == (True,)


def test_the_app_role_can_use_the_rules(empty_db):
    """quota_app (what the web and worker processes log in as a member of) calls every rule the
    delivery, plan sync and the expiry job call."""
    migrate(empty_db)
    with psycopg.connect(empty_db) as c:
        c.execute("INSERT INTO accounts (id, kind, plan) VALUES ('acc-1', 'user', 'free')")
        c.execute("SET ROLE quota_app")
        row = c.execute(
            "SELECT billing_is_lapsed('pro', 'expired', 'free'), subscription_access_rank('past_due'),"
            " billing_event_wins(false, now(), 'active', 'a', false, now(), 'canceled', 'b', false),"
            " billing_effective_status('active', now() - interval '1 s', now()),"
            " (SELECT count(*)"
            "    FROM billing_deciding_subscription('acc-1', NULL, NULL, NULL, NULL, NULL, false)),"
            " billing_set_tier('acc-1', 'free', 'active', NULL, true, 'test', 'free', '{free}', '{urls}',"
            "                  '{5}'),"
            " (SELECT created FROM billing_link_customer('stripe', 'cus_1', 'acc-1', 'evt_1'))"
        ).fetchone()
        # no subscription: the account's status becomes expired, its tier stays; no counter to change
        assert row == (True, 1, True, "expired", 0, 0, True)
        locks = c.execute(
            "SELECT (SELECT count(*) FROM billing_lock_account('acc-1')),"
            " (SELECT count(*) FROM billing_account_for_update('acc-1')),"
            " (SELECT count(*) FROM quota_sync_lock_accounts('{acc-1}', 'free')),"
            " (SELECT count(*)"
            "    FROM quota_sync_limits('{acc-1}', '{urls}', '{5}', '{5}', '{f}', '2026-01', 'test'))"
        ).fetchone()
        assert locks == (1, 1, 1, 1)  # the sync created the missing counter
        c.rollback()

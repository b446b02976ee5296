"""Migrations apply to an empty database, and running them again is a no-op; 0019 (key rotation)
keeps the keys of a populated database, without a rewrite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from yoyo import get_backend, read_migrations

from service.keys import KeyOwner, create_key, hash_key, verify_key
from service.migrate import MIGRATIONS_DIR, migrate, yoyo_url

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


def _migrate_before(url: str, first: str) -> None:
    """Apply the versioned migrations before `first` only, as a database of that release has them."""
    every = read_migrations(str(MIGRATIONS_DIR))
    backend = get_backend(yoyo_url(url))
    try:
        backend.apply_migrations(
            backend.to_apply(every.__class__([m for m in every if m.id < first], every.post_apply))
        )
    finally:
        backend.connection.close()


def _files(c: psycopg.Connection, *tables: str) -> dict[str, int]:
    """The file of each of `tables` and of each of their indexes: a rewrite or a rebuild changes it."""
    rows = c.execute(
        "SELECT c.relname, c.relfilenode FROM pg_class c WHERE c.relname = ANY(%(t)s) OR c.oid IN"
        " (SELECT indexrelid FROM pg_index i JOIN pg_class r ON r.oid = i.indrelid"
        " WHERE r.relname = ANY(%(t)s))",
        {"t": list(tables)},
    ).fetchall()
    return dict(rows)


def test_the_rotation_migration_keeps_the_keys_of_a_running_service(empty_db: str) -> None:
    """0019 on a database with keys: each live key still works and stays its name's one live key,
    a revoked one stays refused, and api_keys is not rewritten."""
    _migrate_before(empty_db, "0019")
    live, revoked = "qlk_live", "qlk_revoked"
    with psycopg.connect(empty_db, autocommit=True) as c:  # as the owner, as `keys create` writes them
        c.execute(
            "INSERT INTO api_keys (name, role, key_hash, revoked_at)"
            " VALUES ('svc', 'product', %s, NULL), ('svc', 'product', %s, now())",
            (hash_key(live), hash_key(revoked)),
        )
        on_disk = c.execute("SELECT pg_relation_filenode('api_keys')").fetchone()
    migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as c:
        assert c.execute("SELECT pg_relation_filenode('api_keys')").fetchone() == on_disk
        assert verify_key(c, live) == KeyOwner(name="svc", role="product")
        assert verify_key(c, revoked) is None
        with pytest.raises(psycopg.errors.UniqueViolation):
            create_key(c, name="svc", role="product")


def test_the_row_rules_migration_keeps_ledger_and_counters_in_place(empty_db: str) -> None:
    """0021 (the ledger's rules as domains, the counters' limit rules as a trigger) on a database
    with rows: no table or index is rewritten, the rows read the same, and the rules still refuse."""
    _migrate_before(empty_db, "0021")
    rows = (
        # grant_id, alerted, alert_pct: columns of later migrations (0026, 0027), with their defaults
        "SELECT (SELECT array_agg(to_jsonb(l) - 'grant_id' ORDER BY id) FROM ledger l)::text,"
        " (SELECT array_agg(to_jsonb(q) - 'alerted' - 'alert_pct') FROM quotas q)::text"
    )
    with psycopg.connect(empty_db, autocommit=True) as c:  # as the owner
        c.execute(
            "INSERT INTO accounts (id, kind, plan) VALUES ('acct-1', 'user', 'pro');"
            "INSERT INTO quotas (account_id, metric, plan_limit, period, used, chain_seq)"
            " VALUES ('acct-1', 'links', 500, '2026-11', 3, 1);"
            "INSERT INTO ledger (account_id, metric, period, kind, units, used_after, lim, actor, seq, hash)"
            " VALUES ('acct-1', 'links', '2026-11', 'take', 3, 3, 500, 'svc', 1, sha256('x'))"
        )
        before, on_disk = c.execute(rows).fetchone(), _files(c, "ledger", "quotas", "accounts")
    migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as c:
        after = _files(c, "ledger", "quotas", "accounts")
        # The partial unique indexes name `kind` in their predicates, so Postgres builds them again
        # (documented in the migration); no table and no other index is rewritten.
        rebuilt = {"ledger_take_key", "ledger_one_release", "ledger_one_period_open"}
        rebuilt |= set(after) - on_disk.keys()  # indexes of later migrations (0024: ledger_history)
        assert {k: v for k, v in after.items() if k not in rebuilt} == {
            k: v for k, v in on_disk.items() if k not in rebuilt
        }
        assert c.execute(rows).fetchone() == before
        insert = (
            "INSERT INTO ledger (account_id, metric, period, kind, units, used_after, actor, seq,"
            " prev_hash, hash) VALUES "
        )
        for refused in (
            "UPDATE quotas SET free_limit = -1",
            "UPDATE quotas SET override_limit = 5",  # an override limit without its flag
            insert
            + "('acct-1', 'links', '2026-11', 'take', 1, 4, 'svc', 2, sha256('x'), sha256('y') || 'z')",
            insert + "(repeat('a', 129), 'links', '2026-11', 'take', 1, 4, 'svc', 1, NULL, sha256('y'))",
        ):
            with pytest.raises(psycopg.errors.CheckViolation):
                c.execute(refused)


def test_the_history_index_is_built_beside_the_rows_without_rewriting_them(empty_db: str) -> None:
    """0024 and 0025 on a ledger with rows: the new indexes are valid (built CONCURRENTLY, outside a
    transaction), ledger_history serves the history's read, and the ledger and its other indexes
    keep their files."""
    _migrate_before(empty_db, "0024")
    with psycopg.connect(empty_db, autocommit=True) as c:  # as the owner
        c.execute(
            "INSERT INTO accounts (id, kind, plan) VALUES ('acct-1', 'user', 'pro');"
            "INSERT INTO ledger (account_id, metric, period, kind, units, used_after, lim, actor, seq, hash)"
            " VALUES ('acct-1', 'links', '2026-11', 'take', 3, 3, 500, 'svc', 1, sha256('x'))"
        )
        before = _files(c, "ledger")
    migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as c:
        after = _files(c, "ledger")
        assert {k: v for k, v in after.items() if k != "ledger_history"} == before
        valid = c.execute(
            "SELECT indisvalid, pg_get_indexdef(indexrelid) FROM pg_index"
            " WHERE indexrelid = 'ledger_history'::regclass"
        ).fetchone()
        assert valid is not None and valid[0] and "(account_id, metric, at)" in valid[1]
        c.execute("SET enable_seqscan = off")
        plan = c.execute(
            "EXPLAIN SELECT * FROM ledger WHERE account_id = 'acct-1' AND metric = 'links' AND at < now()"
            " ORDER BY at DESC LIMIT 1"  # the history's row before its range (service/quota/history.sql)
        ).fetchall()
        assert "ledger_history" in " ".join(row[0] for row in plan)
        valid = c.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'webhook_events_account'::regclass"
        ).fetchone()
        assert valid == (True,)


def test_the_rules_read_once_migration_keeps_counters_and_ledger_in_place(empty_db: str) -> None:
    """0029 and 0030 on a database with rows: no table or index is rewritten, every counter keeps
    its limit and source (now plain columns the trigger keeps), the links rule is validated over the
    rows already there, and both rules still hold."""
    _migrate_before(empty_db, "0029")
    rows = (
        "SELECT (SELECT array_agg(to_jsonb(l) ORDER BY id) FROM ledger l)::text,"
        " (SELECT array_agg(to_jsonb(q) ORDER BY metric) FROM quotas q)::text"
    )
    with psycopg.connect(empty_db, autocommit=True) as c:  # as the owner
        c.execute(
            "INSERT INTO accounts (id, kind, plan) VALUES ('acct-1', 'user', 'pro');"
            "INSERT INTO quotas (account_id, metric, plan_limit, free_limit, override_set, override_limit,"
            " lapsed, period) VALUES ('acct-1', 'links', 500, 10, false, NULL, false, '2026-11'),"
            " ('acct-1', 'seats', 5, 1, false, NULL, true, '2026-11'),"
            " ('acct-1', 'urls', 500, 10, true, 7, false, '2026-11');"
            "INSERT INTO ledger (account_id, metric, period, kind, units, used_after, lim, actor, seq, hash)"
            " VALUES ('acct-1', 'links', '2026-11', 'take', 3, 3, 500, 'svc', 1, sha256('x'))"
        )
        before, on_disk = c.execute(rows).fetchone(), _files(c, "ledger", "quotas")
        assert before is not None and "free_fallback" in before[1]  # the three sources are all there
    migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as c:
        assert _files(c, "ledger", "quotas") == on_disk
        assert c.execute(rows).fetchone() == before
        generated = c.execute(
            "SELECT attname, attgenerated FROM pg_attribute WHERE attrelid = 'quotas'::regclass"
            " AND attname IN ('lim', 'limit_source') ORDER BY 1"
        ).fetchall()
        assert generated == [("lim", ""), ("limit_source", "")]
        assert c.execute(
            "SELECT convalidated FROM pg_constraint WHERE conname = 'ledger_links_check'"
        ).fetchone() == (True,)
        c.execute("UPDATE quotas SET lapsed = true WHERE metric = 'links'")
        assert c.execute("SELECT lim, limit_source FROM quotas WHERE metric = 'links'").fetchone() == (
            10,
            "free_fallback",
        )
        with pytest.raises(psycopg.errors.CheckViolation, match="ledger_links_check"):
            c.execute(
                "INSERT INTO ledger (account_id, metric, period, kind, units, used_after, actor, seq,"
                " prev_hash, hash) VALUES ('acct-1', 'links', '2026-11', 'release', 1, 2, 'svc', 2,"
                " sha256('x'), sha256('y'))"
            )

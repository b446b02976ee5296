"""The service runs as a login role that is a member of quota_app, never as the owner of the tables:
the app and worker fixtures connect as one (tests/conftest.py `app_db_url`), so every HTTP, webhook
and worker test exercises these grants. Here: that role may not change the append-only tables by
any way round, and the app really connects as it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from service.quota import takes
from service.roles import as_login, ensure_login_role
from tests.db.helpers import new_account

TABLES = ("ledger", "audit_log")
REFUSED = {
    "UPDATE": "UPDATE {t} SET actor = 'tampered'",
    "DELETE": "DELETE FROM {t}",
    "TRUNCATE": "TRUNCATE {t}",
    "DISABLE TRIGGER": "ALTER TABLE {t} DISABLE TRIGGER {t}_append_only",
    "DISABLE TRIGGER ALL": "ALTER TABLE {t} DISABLE TRIGGER ALL",
    "DROP TRIGGER": "DROP TRIGGER {t}_append_only ON {t}",
    "replica mode": "SET session_replication_role = replica",  # would skip every ordinary trigger
    "own the table": "ALTER TABLE {t} OWNER TO CURRENT_USER",
}


@pytest.fixture
def filled(conn: Any, plans: Any) -> Any:
    account = new_account(conn, plans)
    takes.take(conn, plans, account_id=account, metric="urls", actor="t")
    conn.execute(
        "INSERT INTO audit_log (actor, action, account_id, old, new) VALUES ('t', 'x', %s, %s, %s)",
        (account, Jsonb(None), Jsonb({"limit": 1})),
    )
    return conn


def _snapshot(conn: Any) -> list[Any]:
    return [conn.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() for t in TABLES]


def test_the_login_role_cannot_change_the_append_only_tables(filled, app_db_url, subtests):
    before = _snapshot(filled)
    with psycopg.connect(app_db_url, autocommit=True) as app:
        who = app.execute(
            "SELECT current_user, rolsuper, pg_has_role(current_user, 'quota_app', 'MEMBER')"
            " FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert who is not None and who[1:] == (False, True), who
        for table in TABLES:
            for change, statement in REFUSED.items():
                with (
                    subtests.test(table=table, change=change),
                    pytest.raises(psycopg.errors.InsufficientPrivilege),
                ):
                    app.execute(statement.format(t=table))
    assert _snapshot(filled) == before
    triggers = filled.execute(
        "SELECT tgname, tgenabled FROM pg_trigger"
        " WHERE tgrelid IN ('ledger'::regclass, 'audit_log'::regclass) AND NOT tgisinternal ORDER BY tgname"
    ).fetchall()
    assert len(triggers) == 4 and {enabled for _, enabled in triggers} == {"O"}, triggers


def test_the_app_connects_as_the_login_role(app):
    with app.extensions["quota"].connection() as conn:
        user, superuser = conn.execute(
            "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    assert user == "quota_ledger_test" and superuser is False


def test_ensure_login_role_is_idempotent_and_sets_the_password(pg_url, db_url, app_role):
    name, password = app_role
    ensure_login_role(pg_url, name, password)  # a second time: no error
    with psycopg.connect(as_login(db_url, name, password), autocommit=True) as c:
        assert c.execute("SELECT current_user").fetchone() == (name,)


def test_ensure_login_role_is_race_safe(pg_url, template_db):
    """Other test runs and deployments create roles on the same cluster at the same time."""
    name = f"ql_race_{uuid.uuid4().hex[:8]}"
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: ensure_login_role(pg_url, name, f"pw{i}"), range(16)))
        with psycopg.connect(pg_url, autocommit=True) as c:
            assert c.execute("SELECT pg_has_role(%s, 'quota_app', 'MEMBER')", (name,)).fetchone() == (True,)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f'DROP ROLE IF EXISTS "{name}"')


def test_migrate_creates_the_login_role_it_is_given(db_url, pg_url):
    """As compose runs it: `migrate --login-role NAME` as the owner, the password from the environment."""
    name = f"ql_login_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DATABASE_URL": db_url, "LOGIN_ROLE_PASSWORD": "s3cr3t"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "service.cli", "migrate", "--login-role", name],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        with psycopg.connect(as_login(db_url, name, "s3cr3t"), autocommit=True) as c:
            row = c.execute(
                "SELECT current_user, pg_has_role(current_user, 'quota_app', 'MEMBER')"
            ).fetchone()
            assert row == (name, True)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f'DROP ROLE IF EXISTS "{name}"')


def test_every_table_is_granted_to_quota_app(conn):
    """A migration that adds a table grants quota_app what the service needs on it (at least SELECT);
    the service never runs as the owner, so a forgotten grant fails in production only."""
    missing = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm')"
        " AND c.relname NOT LIKE '%yoyo%' AND NOT has_table_privilege('quota_app', c.oid, 'SELECT')"
    ).fetchall()
    assert missing == []

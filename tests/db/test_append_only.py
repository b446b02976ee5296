"""The database itself refuses UPDATE, DELETE and TRUNCATE on the ledger and the audit log: a
trigger stops even a superuser, and the application role lacks the privileges anyway; the login
role the service runs as can neither change a row nor get the triggers out of the way."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from service.quota import admin, takes
from tests.db.helpers import new_account

TABLES = ("ledger", "audit_log")
CHANGES = {
    "UPDATE": "UPDATE {t} SET actor = 'tampered'",
    "DELETE": "DELETE FROM {t}",
    "TRUNCATE": "TRUNCATE {t}",
}
# What the service's login role might try besides: each is refused too.
REFUSED = {
    **CHANGES,
    "DISABLE TRIGGER": "ALTER TABLE {t} DISABLE TRIGGER {t}_append_only",
    "DISABLE TRIGGER ALL": "ALTER TABLE {t} DISABLE TRIGGER ALL",
    "DROP TRIGGER": "DROP TRIGGER {t}_append_only ON {t}",
    "replica mode": "SET session_replication_role = replica",  # would skip every ordinary trigger
    "own the table": "ALTER TABLE {t} OWNER TO CURRENT_USER",
}


@pytest.fixture
def filled(conn, plans):
    account = new_account(conn, plans)
    takes.take(conn, plans, account_id=account, metric="urls", actor="t")
    conn.execute(
        "INSERT INTO audit_log (actor, action, account_id, old, new) VALUES ('t', 'x', %s, %s, %s)",
        (account, Jsonb(None), Jsonb({"limit": 1})),
    )
    return conn


def _snapshot(conn):
    return [conn.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() for t in TABLES]


def test_trigger_refuses_even_a_superuser(filled, subtests):
    assert filled.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
    before = _snapshot(filled)
    for table in TABLES:
        for change, sql in CHANGES.items():
            with subtests.test(table=table, change=change):
                with pytest.raises(
                    psycopg.errors.InsufficientPrivilege, match=f"{table} is append-only: {change}"
                ):
                    filled.execute(sql.format(t=table))
                assert _snapshot(filled) == before


def test_application_role_lacks_the_privilege(filled, as_service, subtests):
    """Even with the triggers dropped, the service's role (quota_app) may not change a row."""
    before = _snapshot(filled)
    # Citus changes triggers of distributed tables only when told to (migrations/0012); on one
    # PostgreSQL the setting is an unused placeholder.
    filled.execute("SET citus.enable_unsafe_triggers = on")
    for t in TABLES:
        filled.execute(f"DROP TRIGGER {t}_append_only ON {t}")
        filled.execute(f"DROP TRIGGER {t}_no_truncate ON {t}")
    for table in TABLES:
        for change, sql in CHANGES.items():
            with subtests.test(table=table, change=change):
                refused = pytest.raises(
                    psycopg.errors.InsufficientPrivilege, match=f"permission denied for table {table}"
                )
                with as_service(filled), refused:
                    filled.execute(sql.format(t=table))
                assert _snapshot(filled) == before
    filled.execute("UPDATE ledger SET actor = actor")  # the triggers really are gone: only privileges held


def test_application_role_appends_through_the_writers_only(filled, as_service, plans):
    """It reads and appends through the service's operations (migrations/repeatable/ledger_writers.sql);
    a direct INSERT is refused (tests/db/test_ledger_writers.py: what it could forge otherwise)."""
    with as_service(filled):
        account = new_account(filled, plans)
        t = takes.take(filled, plans, account_id=account, metric="urls", actor="t")
        assert takes.release(filled, take_id=t.take_id, actor="t").released
        assert admin.soft_delete(filled, account_id=account, actor="t")  # audited by the same call
        assert filled.execute("SELECT count(*) FROM ledger").fetchone()[0] == 3
        audited = filled.execute("SELECT count(*) FROM audit_log WHERE account_id = %s", (account,))
        assert audited.fetchone()[0] == 1


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

"""The audit log records only what happened: concurrent deletes of one account, or concurrent
clears of one override, write one audit row between them, however many ran."""

from __future__ import annotations

from service.quota import admin, overrides
from tests.db.helpers import new_account
from tests.db.race import race

THREADS = 8


def _audit(conn, account, action):
    return conn.execute(
        "SELECT old, new FROM audit_log WHERE account_id = %s AND action = %s", (account, action)
    ).fetchall()


def test_concurrent_deletes_audit_once(conn, plans, connect):
    account = new_account(conn, plans)
    results = race(connect(THREADS), lambda c: admin.soft_delete(c, account_id=account, actor="race"))
    assert sorted(results) == [False] * (THREADS - 1) + [True]
    assert _audit(conn, account, "account_deleted") == [({"deleted": False}, {"deleted": True})]


def test_concurrent_clears_audit_once(conn, plans, connect):
    account = new_account(conn, plans)
    overrides.set_override(conn, plans, account_id=account, metric="urls", limit=5, actor="admin")
    results = race(
        connect(THREADS),
        lambda c: overrides.clear_override(c, plans, account_id=account, metric="urls", actor="race"),
    )
    assert sorted(results, key=str) == [None] * (THREADS - 1) + [{"limit": 5}]
    assert _audit(conn, account, "override_cleared") == [({"limit": 5}, None)]

"""Small helpers for database tests: make accounts, read counters and the ledger, check the
counter = ledger invariant. Plain SQL against the real database, never through the code under test."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from service.plans import PlanConfig
from service.quota import accounts
from service.vocabulary import ResetInterval

Conn = psycopg.Connection[Any]


def new_account(conn: Conn, plans: PlanConfig, account_id: str | None = None, *, kind: str = "user") -> str:
    """Create an account on the free plan (with its counter rows); returns its id."""
    account_id = account_id or f"acc-{uuid.uuid4().hex[:12]}"
    assert accounts.upsert_account(conn, plans, account_id=account_id, kind=kind) is True
    return account_id


def monthly_metrics(plans: PlanConfig) -> list[str]:
    """The metrics counted by the calendar month (tests/plans.toml also has a daily one and seats,
    an allocation): the ones tests of the monthly reset and rollover move between months."""
    return [m for m in plans.metrics if plans.metric(m).reset == ResetInterval.MONTH]


def set_override(conn: Conn, account_id: str, metric: str, limit: int | None) -> None:
    """Set the counter's limit directly (test set-up, not the admin API under test)."""
    cur = conn.execute(
        "UPDATE quotas SET override_set = true, override_limit = %s WHERE account_id = %s AND metric = %s",
        (limit, account_id, metric),
    )
    assert cur.rowcount == 1


def soft_delete(conn: Conn, account_id: str) -> None:
    """What the admin soft delete does: both flags (the quota copy is what takes read)."""
    conn.execute("UPDATE accounts SET deleted = true WHERE id = %s", (account_id,))
    conn.execute("UPDATE quotas SET account_deleted = true WHERE account_id = %s", (account_id,))


def counter(conn: Conn, account_id: str, metric: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT period, used, lim, limit_source FROM quotas WHERE account_id = %s AND metric = %s",
            (account_id, metric),
        ).fetchone()
    assert row is not None, f"no counter for {account_id}/{metric}"
    return row


def ledger_rows(
    conn: Conn, account_id: str, metric: str | None = None, kind: str | None = None
) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT * FROM ledger
                WHERE account_id = %s AND (%s::text IS NULL OR metric = %s)
                  AND (%s::text IS NULL OR kind = %s)
                ORDER BY metric, seq""",
            (account_id, metric, metric, kind, kind),
        ).fetchall()


def ledger_used(conn: Conn, account_id: str, metric: str, period: str) -> int:
    """DESIGN's formula: sum(take) - sum(release) over the period's rows after its latest reset row."""
    rows = [r for r in ledger_rows(conn, account_id, metric) if r["period"] == period]
    resets = [r["seq"] for r in rows if r["kind"] == "reset"]
    after = max(resets, default=0)
    total = 0
    for r in rows:
        if r["seq"] > after:
            total += {"take": r["units"], "release": -r["units"]}.get(r["kind"], 0)  # grant rows: 0
    return total


def assert_counter_matches_ledger(conn: Conn, account_id: str, metric: str) -> dict[str, Any]:
    c = counter(conn, account_id, metric)
    assert c["used"] >= 0
    assert c["used"] == ledger_used(conn, account_id, metric, c["period"]), (c, ledger_rows(conn, account_id))
    return c


def set_period(conn: Conn, account_id: str, metric: str, period: str) -> None:
    """Move a counter into an earlier period, as if the month had turned since it was last used."""
    cur = conn.execute(
        "UPDATE quotas SET period = %s WHERE account_id = %s AND metric = %s", (period, account_id, metric)
    )
    assert cur.rowcount == 1


def set_plan(conn: Conn, plans: PlanConfig, *, account_id: str, plan: str, status: str, actor: str) -> int:
    """Give the account this tier and status, and its limits the plan's (quota_set_limits_for_plan,
    the quota rule every billing change calls); returns the number of counters changed. Test set-up
    for a tier no subscription decides."""
    with conn.transaction():
        conn.execute(
            "UPDATE accounts SET plan = %s, subscription_status = %s WHERE id = %s",
            (plan, status, account_id),
        )
        row = conn.execute(
            "SELECT quota_set_limits_for_plan(%(account_id)s, %(plan)s,"
            " billing_is_lapsed(%(plan)s, %(status)s, %(free_plan)s), %(actor)s, %(free_plan)s,"
            " %(plan_names)s::text[], %(plan_metrics)s::text[], %(plan_limits)s::bigint[])",
            {"account_id": account_id, "plan": plan, "status": status, "actor": actor, **plans.limit_table},
        ).fetchone()
    assert row is not None
    return int(row[0])

"""Cross-account queries right after a bulk write, before autovacuum has analyzed it: the monthly
reset leaves the planner believing the new period holds a handful of rows. Reconciliation is
shaped so that its plan cannot go quadratic on that estimate, and the reset analyzes what it wrote."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg

from service.db import Q
from service.quota import periods, reset
from service.quota.ledger import reconcile

P0 = periods.next_period(periods.current_period())
P1 = periods.next_period(P0)
AT = periods.period_start(P1) + timedelta(hours=1)
ACCOUNTS = 6000  # x 3 metrics


# Rows written here bypass the writers, so they carry no real chain; nothing here verifies it.
SEED_HASH = bytes(32)


def seed(conn: psycopg.Connection[Any]) -> None:
    """ACCOUNTS x 3 counters in P0 holding usage (one take row each), analyzed as such; autovacuum
    off on the two tables so that the statistics stay what they were before the bulk write."""
    for table in ("quotas", "ledger"):
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    conn.execute(
        "INSERT INTO accounts (id, kind, plan) "
        "SELECT 'b' || lpad(i::text, 6, '0'), 'user', 'free' FROM generate_series(1, %s) i",
        (ACCOUNTS,),
    )
    conn.execute(
        "INSERT INTO quotas (account_id, metric, plan_limit, free_limit, period, used) "
        "SELECT a.id, m, NULL, NULL, %s, 0 FROM accounts a, unnest(ARRAY['api_calls', 'seats', 'urls']) m",
        (P0,),
    )
    conn.execute(
        "INSERT INTO ledger (account_id, metric, period, kind, units, used_after, actor, hash, seq) "
        "SELECT account_id, metric, %s, 'take', 1, 1, 'test', %s, 1 FROM quotas",
        (P0, SEED_HASH),
    )
    conn.execute("UPDATE quotas SET used = 1, chain_seq = 1, chain_hash = %s", (SEED_HASH,))
    conn.execute("ANALYZE quotas")
    conn.execute("ANALYZE ledger")


def bulk_write_p1(conn: psycopg.Connection[Any]) -> None:
    """What a reset followed by a few takes leaves in P1, written without any ANALYZE: every counter
    moved to P1 with a reset row (as if it had cleared 1), then a take of 2 on each."""
    conn.execute("UPDATE quotas SET period = %s, used = 2, chain_seq = 3", (P1,))
    conn.execute(
        "INSERT INTO ledger"
        " (account_id, metric, period, kind, units, used_after, idempotency_key, actor, prev_hash, hash,"
        "  seq) "
        "SELECT account_id, metric, %s, 'reset', 1, 0, 'period-open:' || %s, 'test', %s, %s, 2 FROM quotas",
        (P1, P1, SEED_HASH, SEED_HASH),
    )
    conn.execute(
        "INSERT INTO ledger"
        " (account_id, metric, period, kind, units, used_after, actor, prev_hash, hash, seq) "
        "SELECT account_id, metric, %s, 'take', 2, 2, 'test', %s, %s, 3 FROM quotas",
        (P1, SEED_HASH, SEED_HASH),
    )


def estimated_rows(conn: psycopg.Connection[Any], table: str, period: str) -> int:
    row = conn.execute(f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {table} WHERE period = %s", (period,)).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return int(plan[0]["Plan"]["Plan Rows"])


def plan_nodes(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> list[str]:
    row = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    nodes: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node["Node Type"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return nodes


def test_reconciliation_after_an_unanalyzed_bulk_write_is_not_quadratic(
    conn: psycopg.Connection[Any],
) -> None:
    seed(conn)
    bulk_write_p1(conn)
    # the planner's belief: P1 holds next to nothing
    assert estimated_rows(conn, "ledger", P1) < ACCOUNTS * 6 / 20

    assert "Nested Loop" not in plan_nodes(conn, Q.reconciliation, {"period": P1})
    t = time.monotonic()
    result = reconcile(conn, period=P1)
    took = time.monotonic() - t
    assert result.checked == ACCOUNTS * 3 and result.mismatches == []
    assert took < 5.0, f"reconciliation of {ACCOUNTS * 3} counters took {took:.1f} s"


def test_the_reset_analyzes_what_it_wrote(conn: psycopg.Connection[Any]) -> None:
    seed(conn)
    before = dict(conn.execute("SELECT relname, analyze_count FROM pg_stat_user_tables").fetchall())
    outcome = reset.reset_month(conn, at=AT, duty=1.0)
    assert outcome.status == "done" and outcome.counters_reset == ACCOUNTS * 3
    after = _wait_stats(conn, before)
    assert after["quotas"] > before["quotas"] and after["ledger"] > before["ledger"]
    assert estimated_rows(conn, "quotas", P1) > ACCOUNTS * 3 / 2


def test_the_service_role_may_analyze_through_the_function(conn: psycopg.Connection[Any]) -> None:
    """ANALYZE needs the table's owner; the service runs as a member of quota_app."""
    role = f"ql_t_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE ROLE {role} IN ROLE quota_app")
    try:
        before = dict(conn.execute("SELECT relname, analyze_count FROM pg_stat_user_tables").fetchall())
        conn.execute(f"SET ROLE {role}")
        conn.execute(Q.analyze_after_bulk_write)
        conn.execute("RESET ROLE")
        after = _wait_stats(conn, before)
        assert after["quotas"] > before["quotas"] and after["ledger"] > before["ledger"]
    finally:
        conn.execute("RESET ROLE")
        conn.execute(f"DROP ROLE {role}")


def _wait_stats(conn: psycopg.Connection[Any], before: dict[str, int]) -> dict[str, int]:
    """The statistics collector reports with a short delay (and a transaction's snapshot of it)."""
    deadline = time.monotonic() + 5
    while True:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        after = dict(conn.execute("SELECT relname, analyze_count FROM pg_stat_user_tables").fetchall())
        if after["ledger"] > before["ledger"] or time.monotonic() > deadline:
            return after
        time.sleep(0.1)

"""A counter's effective limit (`quotas.lim`) and its source (`limit_source`) follow 0001's rule on
every write of their inputs: an admin override, else the free plan's limit for a lapsed paid plan,
else the plan's. Since migration 0029 a trigger keeps them on one PostgreSQL (this module's
subject; on Citus they stay generated columns, which the API's tests cover there), and it fires
only on a write of those columns, so a take never pays for it; the ledger's links rule is one call
of ledger_links_ok per row written."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from service.quota import takes
from tests.db.helpers import counter, new_account

METRIC = "urls"


def expected(
    override_set: bool, override_limit: int | None, lapsed: bool, free: int | None, plan: int | None
) -> tuple[int | None, str]:
    """0001's CASE, written out: the rule both forms are held to."""
    if override_set:
        return override_limit, "override"
    if lapsed:
        return free, "free_fallback"
    return plan, "plan"


def _row(conn: psycopg.Connection[Any], account: str, metric: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT plan_limit, free_limit, override_set, override_limit, lapsed, lim, limit_source"
            " FROM quotas WHERE account_id = %s AND metric = %s",
            (account, metric),
        ).fetchone()
    assert row is not None
    return row


def _calls(conn: psycopg.Connection[Any], function: str) -> int:
    """Calls of `function` in the current transaction (track_functions = 'pl' counts PL/pgSQL)."""
    row = conn.execute("SELECT pg_stat_get_xact_function_calls(%s::regproc)", (function,)).fetchone()
    assert row is not None
    return row[0] or 0


@pytest.mark.parametrize(
    "override_set, override_limit, lapsed",
    [(s, o, lp) for s, o, lp in itertools.product([False, True], [None, 7], [False, True]) if s or o is None],
)
@pytest.mark.parametrize("plan_limit, free_limit", [(500, 10), (None, 10), (500, None)])
def test_every_write_of_an_input_sets_the_limit_by_the_rule(
    conn, plans, override_set, override_limit, lapsed, plan_limit, free_limit
):
    account = new_account(conn, plans)
    # a new row takes the rule on INSERT
    conn.execute(
        "INSERT INTO quotas (account_id, metric, plan_limit, free_limit, override_set, override_limit,"
        " lapsed, period) VALUES (%s, 'rule', %s, %s, %s, %s, %s, '2026-11')",
        (account, plan_limit, free_limit, override_set, override_limit, lapsed),
    )
    row = _row(conn, account, "rule")
    assert (row["lim"], row["limit_source"]) == expected(
        override_set, override_limit, lapsed, free_limit, plan_limit
    )

    # and on an UPDATE of each input alone, from the row as it is
    for column, value in [
        ("plan_limit", 42),
        ("free_limit", 3),
        ("lapsed", not lapsed),
        ("override_limit", None),
        ("override_set", not override_set),
    ]:
        conn.execute(
            f"UPDATE quotas SET {column} = %s WHERE account_id = %s AND metric = 'rule'", (value, account)
        )
        row = _row(conn, account, "rule")
        assert (row["lim"], row["limit_source"]) == expected(
            row["override_set"], row["override_limit"], row["lapsed"], row["free_limit"], row["plan_limit"]
        ), column


def test_a_direct_write_of_the_limit_is_computed_over(conn, plans):
    """`lim` is derived: whoever sets it by hand (only the tables' owner may write quotas) gets the
    rule's value back, as a generated column would have refused the write."""
    account = new_account(conn, plans)
    before = counter(conn, account, METRIC)
    conn.execute(
        "UPDATE quotas SET lim = 1, limit_source = 'override' WHERE account_id = %s AND metric = %s",
        (account, METRIC),
    )
    after = counter(conn, account, METRIC)
    assert (after["lim"], after["limit_source"]) == (before["lim"], before["limit_source"]) != (1, "override")


def test_a_take_never_fires_the_limit_trigger_and_checks_its_row_once(conn, plans):
    """The point of 0029: a take's UPDATE sets no input of the limit, so the trigger is not even
    called; its ledger row's links rule is checked by one call of ledger_links_ok. A change of the
    plan's limit does call the trigger."""
    account = new_account(conn, plans)
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'pl'")
        for _ in range(3):
            takes.take(conn, plans, account_id=account, metric=METRIC, units=1, actor="t")
        assert _calls(conn, "quotas_effective_limit") == 0
        assert _calls(conn, "ledger_links_ok") == 3
        conn.execute(
            "UPDATE quotas SET plan_limit = 9 WHERE account_id = %s AND metric = %s", (account, METRIC)
        )
        assert _calls(conn, "quotas_effective_limit") == 1
    assert counter(conn, account, METRIC)["lim"] == 9


@pytest.mark.parametrize(
    "kind, take_id, seq, prev_hash",
    [
        ("release", None, 2, "sha256('p')"),  # a release that names no take
        ("take", 1, 2, "sha256('p')"),  # a take that names one
        ("take", None, 2, "NULL"),  # a row after the first with no previous hash
        ("take", None, 1, "sha256('p')"),  # a first row with one
    ],
)
def test_the_links_rule_still_refuses_a_row_that_breaks_it(conn, plans, kind, take_id, seq, prev_hash):
    account = new_account(conn, plans)
    with pytest.raises(psycopg.errors.CheckViolation, match="ledger_links_check"):
        conn.execute(
            "INSERT INTO ledger (account_id, metric, period, kind, units, used_after, take_id, actor, seq,"
            f" prev_hash, hash) VALUES (%s, %s, '2026-11', %s, 1, 1, %s, 't', %s, {prev_hash}, sha256('h'))",
            (account, METRIC, kind, take_id, seq),
        )
    assert conn.execute("SELECT count(*) FROM ledger WHERE account_id = %s", (account,)).fetchone() == (0,)

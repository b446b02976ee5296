"""No overshoot, no lost update: N concurrent takes against limit L grant exactly min(N, L) units,
each on its own connection, all released by one barrier. The naive read-check-write version, run
by the same harness, overshoots: proof that the harness produces real contention."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from service.errors import QuotaExhausted
from service.quota import takes
from tests.db.conftest import THREADS
from tests.db.helpers import assert_counter_matches_ledger, counter, ledger_rows, new_account, set_override
from tests.db.race import race

METRIC = "urls"


def _take_one(plans: Any, account_id: str) -> Any:
    def go(conn: Any) -> str:
        try:
            takes.take(conn, plans, account_id=account_id, metric=METRIC, actor="race")
        except QuotaExhausted:
            return "refused"
        return "granted"

    return go


def test_50_takes_against_limit_10_grant_exactly_10(conn, plans, connect):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)
    conns = connect(THREADS)

    results = race(conns, _take_one(plans, account))

    assert [r for r in results if isinstance(r, BaseException)] == []
    assert results.count("granted") == 10
    assert results.count("refused") == 40
    assert counter(conn, account, METRIC)["used"] == 10
    rows = ledger_rows(conn, account, METRIC, kind="take")
    assert len(rows) == 10
    assert sorted(r["used_after"] for r in rows) == list(range(1, 11))  # each grant saw its own value
    assert_counter_matches_ledger(conn, account, METRIC)


@pytest.mark.slow
def test_500_takes_against_limit_100_over_many_rounds(conn, plans, connect):
    """50 connections x 10 takes each = 500 takes against 100, per round, on a fresh account."""
    rounds, per_thread, limit = int(os.environ.get("RACE_ROUNDS", "20")), 10, 100
    conns = connect(THREADS)
    for round_ in range(rounds):
        account = new_account(conn, plans)
        set_override(conn, account, METRIC, limit)

        def many(c: Any, account: str = account) -> list[str]:
            one = _take_one(plans, account)
            return [one(c) for _ in range(per_thread)]

        results = race(conns, many)

        errors = [r for r in results if isinstance(r, BaseException)]
        assert errors == [], f"round {round_}: client-visible errors {errors[:3]}"
        outcomes = [o for r in results for o in r]  # type: ignore[union-attr]
        assert outcomes.count("granted") == limit, f"round {round_}"
        assert outcomes.count("refused") == THREADS * per_thread - limit
        assert counter(conn, account, METRIC)["used"] == limit
        rows = ledger_rows(conn, account, METRIC, kind="take")
        assert sorted(r["used_after"] for r in rows) == list(range(1, limit + 1)), f"round {round_}"
        assert all(r["used_after"] <= r["lim"] for r in rows)


def _naive_take(account_id: str) -> Any:
    """Read, check, write in separate statements with no lock: the bug the real take avoids."""

    def go(conn: Any) -> str:
        used, lim = conn.execute(
            "SELECT used, lim FROM quotas WHERE account_id = %s AND metric = %s", (account_id, METRIC)
        ).fetchone()
        if used + 1 > lim:
            return "refused"
        time.sleep(0.005)  # the gap a real request has between its read and its write
        conn.execute(
            "UPDATE quotas SET used = %s WHERE account_id = %s AND metric = %s",
            (used + 1, account_id, METRIC),
        )
        conn.execute(
            """INSERT INTO ledger (account_id, metric, period, kind, units, used_after, lim, actor, prev_hash,
                                 hash, seq)
               SELECT account_id, metric, period, 'take', 1, %s, lim, 'naive', sha256(''), sha256(''),
                      nextval('ledger_id_seq') + 1
                 FROM quotas WHERE account_id = %s AND metric = %s""",
            (used + 1, account_id, METRIC),
        )
        return "granted"

    return go


def test_negative_control_naive_read_check_write_overshoots(conn, plans, connect):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)
    conns = connect(THREADS)

    results = race(conns, _naive_take(account))

    assert [r for r in results if isinstance(r, BaseException)] == []
    granted = results.count("granted")
    takes_written = len(ledger_rows(conn, account, METRIC, kind="take"))
    used = counter(conn, account, METRIC)["used"]
    assert granted > 10, "the naive version should overshoot the limit"
    assert takes_written == granted
    assert used < granted, "the naive version should lose updates (counter != ledger)"

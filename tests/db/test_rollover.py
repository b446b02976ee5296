"""Lazy rollover: a counter still holding an earlier period counts as 0 for the next take, and the
rollover is a reset ledger row carrying the value it cleared, written exactly once."""

from __future__ import annotations

import pytest

from service.errors import QuotaExhausted
from service.quota import accounts, periods, takes, usage
from tests.db.helpers import (
    assert_counter_matches_ledger,
    counter,
    ledger_rows,
    ledger_used,
    new_account,
    set_override,
    set_period,
)
from tests.db.race import race

METRIC = "urls"
OLD = "2024-01"


def _take(conn, plans, account, units=1, **kw):
    return takes.take(conn, plans, account_id=account, metric=METRIC, units=units, actor="t", **kw)


def _account_with_old_usage(conn, plans, used: int, limit: int | None = 50) -> str:
    account = new_account(conn, plans)
    if limit != 50:
        set_override(conn, account, METRIC, limit)
    set_period(conn, account, METRIC, OLD)
    if used:
        _take(conn, plans, account, used, period=OLD)
    return account


def test_next_take_starts_from_zero_and_records_the_reset(conn, plans):
    account = _account_with_old_usage(conn, plans, used=7, limit=8)
    now = periods.current_period()

    t = _take(conn, plans, account, 5)  # 7 + 5 would not fit in 8; in the new month it does

    assert (t.used, t.period) == (5, now)
    resets = ledger_rows(conn, account, kind="reset")
    assert len(resets) == 1
    r = resets[0]
    assert (r["period"], r["units"], r["used_after"], r["actor"]) == (now, 7, 0, "system:rollover")
    assert r["idempotency_key"] == f"period-open:{now}"
    assert r["id"] < t.take_id
    assert ledger_used(conn, account, METRIC, OLD) == 7, "the closed period keeps its total"
    assert usage.usage(conn, plans, account_id=account, metric=METRIC, period=OLD) == 7
    assert_counter_matches_ledger(conn, account, METRIC)

    _take(conn, plans, account)
    assert len(ledger_rows(conn, account, kind="reset")) == 1


def test_a_counter_that_held_nothing_needs_no_reset_row(conn, plans):
    account = _account_with_old_usage(conn, plans, used=0)
    t = _take(conn, plans, account)
    assert t.used == 1
    assert ledger_rows(conn, account, kind="reset") == []
    assert counter(conn, account, METRIC)["period"] == periods.current_period()


def test_a_refused_take_in_the_new_month_still_opens_it(conn, plans):
    account = _account_with_old_usage(conn, plans, used=3, limit=3)
    with pytest.raises(QuotaExhausted):
        _take(conn, plans, account, 4)
    c = counter(conn, account, METRIC)
    assert (c["period"], c["used"]) == (periods.current_period(), 0)
    assert [r["units"] for r in ledger_rows(conn, account, kind="reset")] == [3]


def test_reads_of_a_stale_counter_show_zero_and_change_nothing(conn, plans):
    account = _account_with_old_usage(conn, plans, used=4)
    view = accounts.get_account(conn, plans, account_id=account)
    m = next(m for m in view.limits if m.metric == METRIC)
    assert (m.used, m.period, m.remaining) == (0, periods.current_period(), 50)
    assert usage.usage(conn, plans, account_id=account, metric=METRIC) == 0
    assert counter(conn, account, METRIC)["period"] == OLD
    assert ledger_rows(conn, account, kind="reset") == []


def test_rollover_over_several_months(conn, plans):
    account = _account_with_old_usage(conn, plans, used=2)
    t = _take(conn, plans, account, period="2024-05")
    assert (t.period, t.used) == ("2024-05", 1)
    assert [(r["period"], r["units"]) for r in ledger_rows(conn, account, kind="reset")] == [("2024-05", 2)]
    assert usage.usage(conn, plans, account_id=account, metric=METRIC, period="2024-03") == 0


def test_a_take_with_a_clock_behind_the_counter_lands_in_the_counters_period(conn, plans):
    account = new_account(conn, plans)
    t = _take(conn, plans, account, period=OLD)
    assert t.period == periods.current_period()
    assert ledger_rows(conn, account, kind="reset") == []


def test_concurrent_takes_at_the_month_boundary_reset_exactly_once(conn, plans, connect):
    account = _account_with_old_usage(conn, plans, used=7, limit=30)
    now = periods.current_period()
    conns = connect(50)

    def go(c):
        try:
            return _take(c, plans, account).used
        except QuotaExhausted:
            return "refused"

    results = race(conns, go)

    assert [r for r in results if isinstance(r, BaseException)] == []
    assert results.count("refused") == 20
    assert sorted(r for r in results if r != "refused") == list(range(1, 31))
    resets = ledger_rows(conn, account, kind="reset")
    assert [(r["period"], r["units"]) for r in resets] == [(now, 7)]
    c = assert_counter_matches_ledger(conn, account, METRIC)
    assert (c["period"], c["used"]) == (now, 30)


def test_concurrent_takes_with_clocks_on_both_sides_of_the_boundary(conn, plans, connect):
    """Half the callers still think it is last month. Whatever interleaving happens, the old month
    ends with exactly what the single reset row cleared, and the new one starts from it."""
    account = _account_with_old_usage(conn, plans, used=5, limit=None)
    now = periods.current_period()
    conns = connect(40)
    clock = {id(c): (OLD if i % 2 else now) for i, c in enumerate(conns)}

    results = race(conns, lambda c: _take(c, plans, account, period=clock[id(c)]))

    assert [r for r in results if isinstance(r, BaseException)] == []
    resets = ledger_rows(conn, account, kind="reset")
    assert len(resets) == 1 and resets[0]["period"] == now
    took_old = [r for r in results if r.period == OLD]
    assert resets[0]["units"] == 5 + len(took_old) == ledger_used(conn, account, METRIC, OLD)
    c = assert_counter_matches_ledger(conn, account, METRIC)
    assert (c["period"], c["used"]) == (now, 40 - len(took_old))

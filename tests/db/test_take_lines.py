"""Multi-line takes (issue 24): every line or none, in one statement that locks the lines' counters
in metric order; one idempotency key names the lines' rows; each line's take released on its own.
Lines mix the three kinds of tests/plans.toml: urls (monthly), exports (daily), seats (allocation)."""

from __future__ import annotations

from typing import Any

import pytest

from service.errors import IdempotencyKeyReused, QuotaExhausted
from service.quota import chain, periods, takes
from service.quota.takes import Line
from tests.db.helpers import (
    assert_counter_matches_ledger,
    counter,
    ledger_rows,
    new_account,
    set_override,
    set_period,
)
from tests.db.race import race

# Fewer than tests/db/test_race.py's 50: the test servers' 100 connections are shared with other runs.
CONNECTIONS = 24
MIXED = [Line(metric="urls", units=3), Line(metric="exports", units=2), Line(metric="seats", units=1)]


def _take_lines(conn: Any, plans: Any, account: str, lines: list[Line], key: str | None = None) -> Any:
    return takes.take_lines(conn, plans, account_id=account, lines=lines, idempotency_key=key, actor="t")


def test_every_line_is_taken_in_the_order_given_each_with_its_row(conn, plans):
    account = new_account(conn, plans)
    granted = _take_lines(conn, plans, account, MIXED, "k1")
    assert [(t.metric, t.units, t.used, t.replayed) for t in granted] == [
        ("urls", 3, 3, False),
        ("exports", 2, 2, False),
        ("seats", 1, 1, False),
    ]
    assert [t.period for t in granted] == [plans.period("urls"), plans.period("exports"), None]
    assert len({t.take_id for t in granted}) == 3
    for line in MIXED:
        assert_counter_matches_ledger(conn, account, line.metric)
    # One key names the three rows: the first line in metric order holds it, the others derive from it.
    keys = {r["metric"]: r["idempotency_key"] for r in ledger_rows(conn, account, kind="take")}
    assert keys == {"exports": "k1", "seats": "k1\x1f2", "urls": "k1\x1f3"}
    assert chain.verify(conn).ok  # each row linked into its counter's chain


def test_each_line_is_released_on_its_own(conn, plans):
    account = new_account(conn, plans)
    urls, _exports, seats = _take_lines(conn, plans, account, MIXED)
    assert takes.release(conn, take_id=seats.take_id, actor="t", account_id=account).released
    assert (counter(conn, account, "seats")["used"], counter(conn, account, "urls")["used"]) == (0, 3)
    assert takes.release(conn, take_id=urls.take_id, actor="t").released
    assert counter(conn, account, "urls")["used"] == 0
    assert counter(conn, account, "exports")["used"] == 2
    for line in MIXED:
        assert_counter_matches_ledger(conn, account, line.metric)


def test_a_line_that_does_not_fit_refuses_them_all_and_names_every_short_line(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, "exports", 1)
    with pytest.raises(QuotaExhausted) as refused:
        _take_lines(conn, plans, account, [*MIXED[:2], Line(metric="seats", units=2)], "k")
    assert refused.value.details["lines"] == [
        {"metric": "exports", "units": 2, "remaining": 1, "limit": 1},
        {"metric": "seats", "units": 2, "remaining": 1, "limit": 1},
    ]
    assert ledger_rows(conn, account) == []
    assert [counter(conn, account, m)["used"] for m in ("urls", "exports", "seats")] == [0, 0, 0]
    # The key was not used: the lines that fit are granted with it.
    assert len(_take_lines(conn, plans, account, [MIXED[0], Line(metric="exports")], "k")) == 2


def test_counters_are_made_ready_line_by_line_first(conn, plans):
    """A counter not created yet, or last period's: each line's is mended as a single take's."""
    account = new_account(conn, plans)
    set_period(conn, account, "urls", "2020-01")
    takes.take(conn, plans, account_id=account, metric="exports", units=2, actor="t")
    set_period(conn, account, "exports", "2020-01-01")  # as if that take were of an earlier day
    conn.execute("DELETE FROM quotas WHERE account_id = %s AND metric = 'seats'", (account,))  # as owner
    granted = _take_lines(conn, plans, account, MIXED)
    assert [t.used for t in granted] == [3, 2, 1]
    assert counter(conn, account, "exports")["period"] == plans.period("exports")
    assert [r["kind"] for r in ledger_rows(conn, account, "exports")] == ["take", "reset", "take"]
    for line in MIXED:
        assert_counter_matches_ledger(conn, account, line.metric)


def test_the_same_key_again_returns_the_original_takes(conn, plans):
    account = new_account(conn, plans)
    first = _take_lines(conn, plans, account, MIXED, "k")
    again = _take_lines(conn, plans, account, list(reversed(MIXED)), "k")
    assert [t.take_id for t in again] == [t.take_id for t in reversed(first)]
    assert all(t.replayed for t in again)
    assert [counter(conn, account, line.metric)["used"] for line in MIXED] == [3, 2, 1]


@pytest.mark.parametrize(
    "other",
    [
        [Line(metric="urls", units=3), Line(metric="exports", units=2)],
        [*MIXED[:2], Line(metric="seats", units=2)],
        [*MIXED, Line(metric="api_calls")],
    ],
    ids=["fewer lines", "other units", "more lines"],
)
def test_the_key_with_other_lines_is_reused(conn, plans, other):
    account = new_account(conn, plans)
    first = _take_lines(conn, plans, account, MIXED, "k")
    with pytest.raises(IdempotencyKeyReused) as reused:
        _take_lines(conn, plans, account, other, "k")
    assert reused.value.details["take_id"] == first[1].take_id  # the row that holds the key: exports
    assert len(ledger_rows(conn, account, kind="take")) == 3


def test_single_and_multi_line_takes_share_one_key_namespace(conn, plans):
    account = new_account(conn, plans)
    single = takes.take(conn, plans, account_id=account, metric="urls", idempotency_key="s", actor="t")
    with pytest.raises(IdempotencyKeyReused):
        _take_lines(conn, plans, account, MIXED, "s")
    _take_lines(conn, plans, account, MIXED, "m")
    for metric, units in (("exports", 2), ("urls", 3)):  # even a line's own metric and units
        with pytest.raises(IdempotencyKeyReused):
            takes.take(
                conn, plans, account_id=account, metric=metric, units=units, idempotency_key="m", actor="t"
            )
    # A take of one line is a single take: the key replays across the two forms.
    [again] = _take_lines(conn, plans, account, [Line(metric="urls")], "s")
    assert again.take_id == single.take_id and again.replayed
    assert counter(conn, account, "urls")["used"] == 4


def test_opposite_line_orders_under_concurrency_never_deadlock_nor_overshoot(conn, plans, connect):
    """Half the connections take [urls, exports], half [exports, urls], each several times, against
    limits that run out: locked in metric order, none waits on another in a cycle (a deadlock would
    raise psycopg.errors.DeadlockDetected); granted lines never pass a limit, and both counters always
    move together."""
    account = new_account(conn, plans)
    set_override(conn, account, "urls", 40)
    set_override(conn, account, "exports", 40)
    forward = [Line(metric="urls"), Line(metric="exports")]
    conns = connect(CONNECTIONS)
    order = {id(c): forward if i % 2 else forward[::-1] for i, c in enumerate(conns)}

    def many(c: Any) -> list[str]:
        out = []
        for _ in range(4):
            try:
                _take_lines(c, plans, account, order[id(c)])
                out.append("granted")
            except QuotaExhausted:
                out.append("refused")
        return out

    results = race(conns, many)
    assert [r for r in results if isinstance(r, BaseException)] == []
    outcomes = [o for r in results if isinstance(r, list) for o in r]
    assert outcomes.count("granted") == 40 and outcomes.count("refused") == CONNECTIONS * 4 - 40
    assert counter(conn, account, "urls")["used"] == counter(conn, account, "exports")["used"] == 40
    assert_counter_matches_ledger(conn, account, "urls")
    assert_counter_matches_ledger(conn, account, "exports")
    assert len(ledger_rows(conn, account, kind="take")) == 80
    assert chain.verify(conn).ok


def test_the_day_of_a_daily_line_is_the_take_s_period(conn, plans):
    account = new_account(conn, plans)
    [exports] = _take_lines(conn, plans, account, [Line(metric="exports")])
    assert exports.period == periods.day_of(periods.now())

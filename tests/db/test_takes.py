"""Takes and releases on one counter: multi-unit takes, refusals that move nothing, releases that
give back exactly once, never below zero, and only in the take's own period."""

from __future__ import annotations

import pytest

from service.errors import AccountDeleted, QuotaExhausted, UnknownAccount, UnknownMetric, UnknownTake
from service.quota import chain, periods, takes
from tests.db.helpers import (
    assert_counter_matches_ledger,
    counter,
    ledger_rows,
    new_account,
    set_override,
    set_period,
    soft_delete,
)
from tests.db.race import race

METRIC = "urls"


def _take(conn, plans, account, units=1, **kw):
    return takes.take(conn, plans, account_id=account, metric=METRIC, units=units, actor="t", **kw)


def test_multi_unit_takes_stop_at_the_limit(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)

    granted = [_take(conn, plans, account, 3) for _ in range(3)]
    with pytest.raises(QuotaExhausted) as e:
        _take(conn, plans, account, 3)

    assert [t.used for t in granted] == [3, 6, 9]
    assert [t.remaining for t in granted] == [7, 4, 1]
    assert all(t.limit == 10 and t.limit_source == "override" for t in granted)
    assert e.value.details["used"] == 9
    assert e.value.details["limit"] == 10
    assert e.value.details["remaining"] == 1
    assert counter(conn, account, METRIC)["used"] == 9
    assert len(ledger_rows(conn, account)) == 3
    assert _take(conn, plans, account, 1).used == 10  # the last unit still fits


def test_a_take_reports_plan_limit_and_period(conn, plans):
    account = new_account(conn, plans)
    t = _take(conn, plans, account)
    assert (t.used, t.limit, t.remaining, t.limit_source) == (1, 50, 49, "plan")
    assert t.period == periods.current_period()
    row = ledger_rows(conn, account)[0]
    assert (row["kind"], row["units"], row["used_after"], row["actor"], row["id"]) == (
        "take",
        1,
        1,
        "t",
        t.take_id,
    )


def test_limit_zero_refuses_everything_and_unlimited_refuses_nothing(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 0)
    with pytest.raises(QuotaExhausted):
        _take(conn, plans, account)
    set_override(conn, account, METRIC, None)
    t = _take(conn, plans, account, 2**31 - 1)
    assert (t.used, t.limit, t.remaining) == (2**31 - 1, None, None)


def test_refusals_for_unknown_account_metric_and_deleted_account(conn, plans):
    with pytest.raises(UnknownAccount):
        _take(conn, plans, "nobody")
    account = new_account(conn, plans)
    with pytest.raises(UnknownMetric):
        takes.take(conn, plans, account_id=account, metric="bananas", actor="t")
    soft_delete(conn, account)
    with pytest.raises(AccountDeleted):
        _take(conn, plans, account)
    assert ledger_rows(conn, account) == []
    assert counter(conn, account, METRIC)["used"] == 0


def test_release_gives_back_exactly_its_units_once(conn, plans):
    account = new_account(conn, plans)
    t3 = _take(conn, plans, account, 3)
    _take(conn, plans, account, 2)

    first = takes.release(conn, take_id=t3.take_id, actor="r")
    second = takes.release(conn, take_id=t3.take_id, actor="r")

    assert first.released and (first.units, first.used) == (3, 2)
    assert (second.released, second.reason) == (False, "already_released")
    assert counter(conn, account, METRIC)["used"] == 2
    releases = ledger_rows(conn, account, kind="release")
    assert [(r["take_id"], r["units"], r["used_after"], r["actor"]) for r in releases] == [
        (t3.take_id, 3, 2, "r")
    ]
    assert_counter_matches_ledger(conn, account, METRIC)


def test_release_of_unknown_take(conn, plans):
    with pytest.raises(UnknownTake):
        takes.release(conn, take_id=123456, actor="r")


def test_release_id_of_a_release_row_is_not_a_take(conn, plans):
    account = new_account(conn, plans)
    t = _take(conn, plans, account)
    rel = takes.release(conn, take_id=t.take_id, actor="r")
    with pytest.raises(UnknownTake):
        takes.release(conn, take_id=rel.release_id, actor="r")


def test_concurrent_releases_of_one_take_release_once(conn, plans, connect):
    account = new_account(conn, plans)
    _take(conn, plans, account, 4)
    t = _take(conn, plans, account, 5)
    conns = connect(20)

    results = race(conns, lambda c: takes.release(c, take_id=t.take_id, actor="r"))

    assert [r for r in results if isinstance(r, BaseException)] == []
    assert sum(r.released for r in results) == 1
    assert {r.reason for r in results if not r.released} == {"already_released"}
    assert counter(conn, account, METRIC)["used"] == 4
    assert len(ledger_rows(conn, account, kind="release")) == 1
    assert_counter_matches_ledger(conn, account, METRIC)


def test_concurrent_takes_and_releases_keep_counter_equal_to_ledger(conn, plans, connect):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 30)
    held = [_take(conn, plans, account) for _ in range(20)]
    conns = connect(40)
    jobs = {id(c): (held[i] if i < 20 else None) for i, c in enumerate(conns)}

    def go(c):
        job = jobs[id(c)]
        if job is not None:
            return takes.release(c, take_id=job.take_id, actor="r").released
        try:
            return _take(c, plans, account).used
        except QuotaExhausted:
            return "refused"

    results = race(conns, go)

    assert [r for r in results if isinstance(r, BaseException)] == []
    assert results[:20] == [True] * 20
    granted = [r for r in results[20:] if r != "refused"]
    assert len(granted) >= 10  # room for 10 even if every release came last
    c = assert_counter_matches_ledger(conn, account, METRIC)
    assert c["used"] == len(granted)
    assert all(r["used_after"] <= 30 for r in ledger_rows(conn, account, kind="take"))


def test_release_never_goes_below_zero(conn, plans):
    """A counter that holds less than the take (an admin reset in between) gives back only what it
    holds, and the ledger row says so."""
    account = new_account(conn, plans)
    t = _take(conn, plans, account, 5)
    conn.execute("UPDATE quotas SET used = 2 WHERE account_id = %s", (account,))  # stands in for a reset

    r = takes.release(conn, take_id=t.take_id, actor="r")

    assert r.released and (r.units, r.used) == (2, 0)
    assert counter(conn, account, METRIC)["used"] == 0
    assert ledger_rows(conn, account, kind="release")[0]["units"] == 2


def test_release_of_a_take_from_an_earlier_period_is_period_closed(conn, plans):
    account = new_account(conn, plans)
    set_period(conn, account, METRIC, "2024-01")
    old = _take(conn, plans, account, 3, period="2024-01")
    assert old.period == "2024-01"
    now = _take(conn, plans, account, 2)  # rolls the counter over into this month
    before = ledger_rows(conn, account)

    r = takes.release(conn, take_id=old.take_id, actor="r")
    r_old_clock = takes.release(conn, take_id=old.take_id, actor="r", period="2024-01")

    assert (r.released, r.reason) == (False, "period_closed")
    assert (r_old_clock.released, r_old_clock.reason) == (False, "period_closed")
    assert counter(conn, account, METRIC)["used"] == now.used == 2
    assert ledger_rows(conn, account) == before


def test_release_in_a_later_period_before_any_take_there_is_period_closed(conn, plans):
    """The counter still holds last month (nobody took this month yet): the take's period is closed
    all the same, and the old counter is not touched."""
    account = new_account(conn, plans)
    set_period(conn, account, METRIC, "2024-01")
    old = _take(conn, plans, account, 3, period="2024-01")

    r = takes.release(conn, take_id=old.take_id, actor="r")

    assert (r.released, r.reason) == (False, "period_closed")
    c = counter(conn, account, METRIC)
    assert (c["period"], c["used"]) == ("2024-01", 3)
    assert len(ledger_rows(conn, account)) == 1


def test_a_metric_added_to_the_config_later_gets_its_counter_on_first_take(conn, plans):
    account = new_account(conn, plans)
    conn.execute("DELETE FROM quotas WHERE account_id = %s AND metric = 'seats'", (account,))

    t = takes.take(conn, plans, account_id=account, metric="seats", actor="t")

    assert (t.used, t.limit, t.limit_source) == (1, 1, "plan")
    with pytest.raises(QuotaExhausted):
        takes.take(conn, plans, account_id=account, metric="seats", actor="t")
    assert_counter_matches_ledger(conn, account, "seats")


def test_an_override_lowered_during_concurrent_takes_is_never_overshot(conn, plans, connect):
    from service.quota import overrides

    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 40)
    conns = connect(41)
    setter = conns[0]

    def go(c):
        if c is setter:
            return overrides.set_override(c, plans, account_id=account, metric=METRIC, limit=3, actor="admin")
        try:
            return _take(conn=c, plans=plans, account=account).used
        except QuotaExhausted:
            return "refused"

    results = race(conns, go)

    assert [r for r in results if isinstance(r, BaseException)] == []
    rows = ledger_rows(conn, account, kind="take")
    assert all(r["used_after"] <= r["lim"] for r in rows)
    assert {r["lim"] for r in rows} <= {40, 3}
    # once the lower limit is in, nothing more is granted over it
    after = [r for r in rows if r["lim"] == 3]
    assert all(r["used_after"] <= 3 for r in after)
    c = assert_counter_matches_ledger(conn, account, METRIC)
    assert c["used"] == len(rows) == 40 - results[1:].count("refused")
    with pytest.raises(QuotaExhausted):
        _take(conn, plans, account)


# --- the statement and the delegated function: one take, two shapes ----------------------------------

_SAME_SEQUENCE = (
    {"units": 1, "idempotency_key": "k1"},  # granted
    {"units": 2},  # granted, up to the limit
    {"units": 1},  # refused: exhausted
    {"units": 1, "idempotency_key": "k1"},  # the first take again, replayed
    {"units": 5, "idempotency_key": "k1"},  # the key with other units: refused
    "last month",
    {"units": 1},  # rolls the counter over, then granted
    {"units": 1, "idempotency_key": "k2"},  # granted
    "deleted",
    {"units": 1},  # refused: the account was deleted
)


def _through(conn, plans, monkeypatch, *, delegated):
    """_SAME_SEQUENCE on a new account, with the take statement (delegated False) or the function
    Citus delegates (True); the answers and ledger rows, without what differs by nature (ids, times,
    the account, hence the hashes)."""
    monkeypatch.setitem(takes._ON_CITUS, (conn.info.host, conn.info.port, conn.info.dbname), delegated)
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 3)
    answers: list[tuple[object, ...]] = []
    first: int | None = None
    for step in _SAME_SEQUENCE:
        if step == "last month":
            set_period(conn, account, METRIC, "2001-01")
            continue
        if step == "deleted":
            soft_delete(conn, account)
            continue
        try:
            t = _take(conn, plans, account, **step)
        except Exception as e:  # the domain error is the answer
            details = dict(getattr(e, "details", {}))
            if "take_id" in details:  # the key's first take, named by its id
                assert details.pop("take_id") == first
            answers.append((type(e).__name__, str(e).replace(account, "<account>"), details))
        else:
            first = first or t.take_id
            answers.append(("granted", t.units, t.used, t.limit, t.period, t.limit_source, t.replayed))
    rows = conn.execute(
        "SELECT seq, period, kind, units, used_after, lim, limit_source, idempotency_key, actor,"
        "       prev_hash IS NULL AS first, hash IS NOT NULL AS hashed"
        "  FROM ledger WHERE account_id = %s ORDER BY seq",
        (account,),
    ).fetchall()
    used = counter(conn, account, METRIC)
    assert_counter_matches_ledger(conn, account, METRIC)
    assert chain.verify(conn, account_id=account).ok
    return answers, rows, {k: used[k] for k in ("used", "lim", "period")}


def test_the_statement_and_the_delegated_function_take_alike(conn, plans, monkeypatch):
    """On one PostgreSQL the service takes with the statement, on Citus with take_delegated: the
    same sequence through both gives the same answers, ledger rows and counter, so the two cannot
    drift."""
    statement = _through(conn, plans, monkeypatch, delegated=False)
    function = _through(conn, plans, monkeypatch, delegated=True)
    assert function == statement
    answers, rows, _ = statement
    assert [a[0] for a in answers] == [
        "granted",
        "granted",
        "QuotaExhausted",
        "granted",
        "IdempotencyKeyReused",
        "granted",
        "granted",
        "AccountDeleted",
    ]
    assert [r[2] for r in rows] == ["take", "take", "reset", "take", "take"]

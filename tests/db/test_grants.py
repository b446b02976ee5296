"""Credits (issue 25): grants on top of the plan's allowance, drawn after it, soonest expiry first,
all or nothing, every unit a row of the counter's hash chain naming the source that paid; released
back grants first; voided forward-only; expired without a job; untouched by resets."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from service.errors import IdempotencyKeyReused, NotGrantable, QuotaExhausted, UnknownGrant
from service.quota import chain, grants, ledger, periods, reset, takes
from service.quota.takes import Line
from service.vocabulary import GrantSource
from tests.db.conftest import THREADS
from tests.db.helpers import (
    assert_counter_matches_ledger,
    counter,
    ledger_rows,
    new_account,
    set_override,
    set_period,
)
from tests.db.race import race
from tests.db.test_chain import tamper

METRIC = "urls"


def _grant(conn: Any, plans: Any, account: str, units: int, ref: str, **kw: Any) -> grants.Grant:
    return grants.create_grant(
        conn,
        plans,
        account_id=account,
        metric=kw.pop("metric", METRIC),
        units=units,
        source=GrantSource.ADMIN,
        source_ref=ref,
        actor="admin-key",
        **kw,
    )


def _take(conn: Any, plans: Any, account: str, units: int = 1, **kw: Any) -> takes.Take:
    return takes.take(
        conn, plans, account_id=account, metric=kw.pop("metric", METRIC), units=units, actor="t", **kw
    )


def _remaining(conn: Any, grant_id: int) -> int:
    row = conn.execute("SELECT remaining FROM grants WHERE id = %s", (grant_id,)).fetchone()
    return int(row[0])


def _assert_grants_match_ledger(conn: Any, account: str) -> None:
    """remaining = units - taken + released - voided - expired, from the ledger, for every grant."""
    rows = conn.execute(
        """SELECT g.id, g.remaining,
                  coalesce(sum(CASE l.kind WHEN 'grant' THEN l.units WHEN 'grant_take' THEN -l.units
                                           WHEN 'grant_release' THEN l.units WHEN 'grant_void' THEN -l.units
                                           WHEN 'grant_expire' THEN -l.units ELSE 0 END), 0)
             FROM grants g LEFT JOIN ledger l ON l.account_id = g.account_id AND l.grant_id = g.id
            WHERE g.account_id = %s GROUP BY g.id, g.remaining""",
        (account,),
    ).fetchall()
    for grant_id, remaining, from_ledger in rows:
        assert remaining == from_ledger, f"grant {grant_id}: {remaining} != ledger {from_ledger}"


def test_a_take_that_fits_the_allowance_draws_nothing_from_grants(conn, plans):
    account = new_account(conn, plans)
    g = _grant(conn, plans, account, 10, "g1")
    t = _take(conn, plans, account, 3)
    assert (t.units, t.from_credits, t.used) == (3, 0, 3)
    assert _remaining(conn, g.grant_id) == 10


def test_a_take_spanning_the_allowance_and_two_grants_writes_what_each_gave(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 5)
    later = _grant(conn, plans, account, 4, "later", expires_at=datetime.now(UTC) + timedelta(days=30))
    never = _grant(conn, plans, account, 10, "never")
    sooner = _grant(conn, plans, account, 2, "sooner", expires_at=datetime.now(UTC) + timedelta(days=2))
    _take(conn, plans, account, 3)

    t = _take(conn, plans, account, 6, idempotency_key="span")

    assert (t.units, t.from_credits, t.used, t.limit) == (6, 4, 5, 5)
    # allowance first (2 left), then the soonest expiry (sooner: 2), then the next (later: 2 of 4)
    rows = [(r["kind"], r["units"], r["grant_id"], r["take_id"]) for r in ledger_rows(conn, account, METRIC)]
    assert rows[-3:] == [
        ("take", 2, None, None),
        ("grant_take", 2, sooner.grant_id, t.take_id),
        ("grant_take", 2, later.grant_id, t.take_id),
    ]
    assert [_remaining(conn, g.grant_id) for g in (sooner, later, never)] == [0, 2, 10]
    assert grants.credits(conn, account_id=account) == {METRIC: 12}
    # the one without expiry is used last
    t2 = _take(conn, plans, account, 3)
    assert t2.from_credits == 3
    assert [_remaining(conn, g.grant_id) for g in (later, never)] == [0, 9]
    assert_counter_matches_ledger(conn, account, METRIC)
    _assert_grants_match_ledger(conn, account)
    assert chain.verify(conn, account_id=account).ok
    assert ledger.reconcile(conn, period=periods.current_period()).mismatches == []
    # the same key answers the same take, credits included, and moves nothing
    again = _take(conn, plans, account, 6, idempotency_key="span")
    assert (again.take_id, again.units, again.from_credits, again.replayed) == (t.take_id, 6, 4, True)
    with pytest.raises(IdempotencyKeyReused):
        _take(conn, plans, account, 5, idempotency_key="span")


def test_a_take_beyond_allowance_and_grants_takes_nothing(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 2)
    g = _grant(conn, plans, account, 3, "g")
    before = len(ledger_rows(conn, account))
    with pytest.raises(QuotaExhausted) as refused:
        _take(conn, plans, account, 6)
    assert type(refused.value) is QuotaExhausted  # told from the refusal read: no take with credits tried
    assert refused.value.details["remaining"] == 2  # the allowance's, as before credits
    assert len(ledger_rows(conn, account)) == before
    assert (counter(conn, account, METRIC)["used"], _remaining(conn, g.grant_id)) == (0, 3)
    assert _take(conn, plans, account, 5).from_credits == 3


def test_50_racers_against_limit_5_and_a_grant_of_5_get_exactly_10(conn, plans, connect):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 5)
    g = _grant(conn, plans, account, 5, "race")
    conns = connect(THREADS)

    def one(c: Any) -> str:
        try:
            t = takes.take(c, plans, account_id=account, metric=METRIC, actor="race")
        except QuotaExhausted:
            return "refused"
        return "credit" if t.from_credits else "allowance"

    results = race(conns, one)

    assert [r for r in results if isinstance(r, BaseException)] == []
    assert (results.count("allowance"), results.count("credit"), results.count("refused")) == (5, 5, 40)
    assert counter(conn, account, METRIC)["used"] == 5
    assert _remaining(conn, g.grant_id) == 0
    assert len(ledger_rows(conn, account, METRIC, kind="grant_take")) == 5
    _assert_grants_match_ledger(conn, account)
    assert chain.verify(conn, account_id=account).ok


def test_release_gives_back_grants_first_then_the_allowance_and_forfeits_an_ended_grant(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 2)
    a = _grant(conn, plans, account, 2, "a", expires_at=datetime.now(UTC) + timedelta(days=1))
    b = _grant(conn, plans, account, 5, "b")
    t = _take(conn, plans, account, 6)  # allowance 2, a 2, b 2
    assert t.from_credits == 4
    grants.void_grant(conn, grant_id=a.grant_id, actor="admin-key")

    r = takes.release(conn, take_id=t.take_id, actor="t", account_id=account)

    assert r.released and r.units == 4  # b's 2 and the allowance's 2; a's 2 forfeited
    rows = [(x["kind"], x["units"], x["grant_id"]) for x in ledger_rows(conn, account, METRIC)]
    assert rows[-3:] == [
        ("grant_release", 2, b.grant_id),
        ("grant_forfeit", 2, a.grant_id),
        ("release", 2, None),
    ]
    assert (_remaining(conn, a.grant_id), _remaining(conn, b.grant_id)) == (0, 5)
    assert counter(conn, account, METRIC)["used"] == 0
    assert not takes.release(conn, take_id=t.take_id, actor="t", account_id=account).released
    assert len(ledger_rows(conn, account, METRIC)) == len(rows)
    _assert_grants_match_ledger(conn, account)
    assert chain.verify(conn, account_id=account).ok


def test_void_is_forward_only_and_answers_the_same_again(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 0)
    g = _grant(conn, plans, account, 10, "v")
    _take(conn, plans, account, 3)

    v = grants.void_grant(conn, grant_id=g.grant_id, actor="admin-key")
    assert (v.voided, v.used, v.changed) == (7, 3, True)
    rows = len(ledger_rows(conn, account))
    again = grants.void_grant(conn, grant_id=g.grant_id, actor="admin-key")
    assert (again.voided, again.used, again.changed) == (7, 3, False)
    assert len(ledger_rows(conn, account)) == rows
    assert counter(conn, account, METRIC)["used"] == 0  # what was drawn stays drawn; nothing negative
    with pytest.raises(QuotaExhausted):
        _take(conn, plans, account, 1)
    assert grants.grant_of(conn, account_id=account, grant_id=g.grant_id).status == "voided"
    with pytest.raises(UnknownGrant):
        grants.void_grant(conn, grant_id=10**12, actor="admin-key")
    _assert_grants_match_ledger(conn, account)


def test_an_expired_grant_is_ignored_without_the_job_and_the_job_writes_its_row_once(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 0)
    g = _grant(conn, plans, account, 4, "e", expires_at=datetime.now(UTC) + timedelta(seconds=1))
    assert _take(conn, plans, account, 1).from_credits == 1
    conn.execute("SELECT pg_sleep(1.1)")
    with pytest.raises(QuotaExhausted):
        _take(conn, plans, account, 1)
    assert grants.credits(conn, account_id=account) == {}
    assert grants.grant_of(conn, account_id=account, grant_id=g.grant_id).status == "expired"

    assert grants.expire_due(conn) >= 1
    assert grants.expire_due(conn) == 0
    expired = ledger_rows(conn, account, METRIC, kind="grant_expire")
    assert [(r["units"], r["grant_id"]) for r in expired] == [(3, g.grant_id)]
    _assert_grants_match_ledger(conn, account)
    assert chain.verify(conn, account_id=account).ok


def test_grants_are_for_consumables_only_and_created_once_per_key(conn, plans):
    account = new_account(conn, plans)
    with pytest.raises(NotGrantable):
        _grant(conn, plans, account, 1, "s", metric="seats")
    first = _grant(conn, plans, account, 5, "k", note="goodwill")
    again = _grant(conn, plans, account, 5, "k")
    assert (first.created, again.created, again.grant_id) == (True, False, first.grant_id)
    assert len(ledger_rows(conn, account, METRIC, kind="grant")) == 1
    with pytest.raises(IdempotencyKeyReused):
        _grant(conn, plans, account, 6, "k")
    audit = conn.execute(
        "SELECT count(*) FROM audit_log WHERE account_id = %s AND action = 'grant_created'", (account,)
    ).fetchone()
    assert audit[0] == 1
    daily = _grant(conn, plans, account, 2, "d", metric="exports")
    assert daily.metric == "exports"


def test_a_multi_line_take_that_needs_credits_is_all_or_nothing(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, "urls", 1)
    set_override(conn, account, "exports", 1)
    g = _grant(conn, plans, account, 2, "u")
    lines = [Line(metric="urls", units=3), Line(metric="exports", units=1)]
    granted = takes.take_lines(conn, plans, account_id=account, lines=lines, idempotency_key="ml", actor="t")
    assert [(t.metric, t.units, t.from_credits) for t in granted] == [("urls", 3, 2), ("exports", 1, 0)]
    assert _remaining(conn, g.grant_id) == 0
    before = len(ledger_rows(conn, account))
    with pytest.raises(QuotaExhausted):
        takes.take_lines(
            conn,
            plans,
            account_id=account,
            lines=[Line(metric="urls", units=1), Line(metric="exports", units=1)],
            actor="t",
        )
    assert len(ledger_rows(conn, account)) == before
    again = takes.take_lines(conn, plans, account_id=account, lines=lines, idempotency_key="ml", actor="t")
    assert [(t.take_id, t.from_credits, t.replayed) for t in again] == [
        (x.take_id, x.from_credits, True) for x in granted
    ]
    assert chain.verify(conn, account_id=account).ok


def test_the_batch_draws_on_credits_as_a_single_take_does(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 1)
    _grant(conn, plans, account, 1, "b")
    items = [takes.TakeItem(account_id=account, metric=METRIC) for _ in range(3)]
    out = takes.take_each(conn, plans, items, actor="t")
    assert [getattr(o, "from_credits", None) for o in out[:2]] == [0, 1]
    assert isinstance(out[2], QuotaExhausted)


def test_the_monthly_reset_and_the_rollover_never_touch_grants(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 1)
    g = _grant(conn, plans, account, 5, "r")
    _take(conn, plans, account, 3)
    assert _remaining(conn, g.grant_id) == 3
    set_period(conn, account, METRIC, "2000-01")
    t = _take(conn, plans, account, 1)  # rolls over: the allowance is whole again
    assert (t.from_credits, t.used) == (0, 1)
    assert _remaining(conn, g.grant_id) == 3
    assert _take(conn, plans, account, 2).from_credits == 2
    assert _remaining(conn, g.grant_id) == 1
    assert chain.verify(conn, account_id=account).ok
    _assert_grants_match_ledger(conn, account)


def test_the_monthly_and_daily_jobs_reset_counters_and_leave_grants_alone(conn, plans):
    account = new_account(conn, plans)
    monthly = _grant(conn, plans, account, 5, "m")
    daily = _grant(conn, plans, account, 4, "d", metric="exports")
    _take(conn, plans, account, 3)
    _take(conn, plans, account, 2, metric="exports")
    set_period(conn, account, METRIC, "2000-01")  # as if the month and the day had turned since
    set_period(conn, account, "exports", "2000-01-01")
    assert reset.reset_month(conn, period=periods.current_period(), duty=1.0).status == "done"
    assert reset.reset_day(conn, day=periods.day_of(periods.now()), duty=1.0).status == "done"
    assert (counter(conn, account, METRIC)["used"], counter(conn, account, "exports")["used"]) == (0, 0)
    assert (_remaining(conn, monthly.grant_id), _remaining(conn, daily.grant_id)) == (5, 4)
    assert grants.credits(conn, account_id=account) == {METRIC: 5, "exports": 4}
    _assert_grants_match_ledger(conn, account)


def test_the_service_role_reads_grants_and_writes_them_only_through_the_writers(conn, plans, as_service):
    account = new_account(conn, plans)
    with as_service(conn):
        g = _grant(conn, plans, account, 2, "svc")
        assert grants.list_grants(conn, account_id=account)[0].grant_id == g.grant_id
        set_override_denied = conn.execute  # noqa: F841
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE grants SET remaining = 100 WHERE id = %s", (g.grant_id,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT grant_append(%s, 'urls', 'grant', 1, NULL, %s, 'x')", (account, g.grant_id))
        grants.void_grant(conn, grant_id=g.grant_id, actor="svc")


def test_reconciliation_and_verify_find_a_grant_changed_behind_the_writers(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 0)
    g = _grant(conn, plans, account, 5, "t")
    _take(conn, plans, account, 2)
    result = ledger.reconcile(conn, period=periods.current_period())
    assert result.ok and result.grants_checked >= 1
    conn.execute("UPDATE grants SET remaining = 5 WHERE id = %s", (g.grant_id,))  # as the owner
    found = ledger.reconcile(conn, period=periods.current_period()).grant_mismatches
    assert [(m.grant_id, m.remaining, m.ledger_remaining) for m in found] == [(g.grant_id, 5, 3)]
    # a grant's row whose grant was rewritten: its hash no longer matches
    tamper(
        conn,
        "UPDATE ledger SET grant_id = grant_id + 1 WHERE account_id = %s AND kind = 'grant_take'",
        account,
    )
    assert not chain.verify(conn, account_id=account).ok


def test_verify_finds_a_well_chained_draw_beyond_what_a_grant_had_left(conn, plans):
    """A row forged by someone who can compute hashes (the owner calling the writer's own append)
    still shows: the grant's balance along the chain does not allow it."""
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 0)
    g = _grant(conn, plans, account, 2, "f")
    t = _take(conn, plans, account, 1)
    assert chain.verify(conn, account_id=account).ok
    conn.execute(
        "SELECT grant_append(%s, %s, 'grant_take', 5, %s, %s, 'forger')",
        (account, METRIC, t.take_id, g.grant_id),
    )
    found = chain.verify(conn, account_id=account)
    assert [f.problem for f in found.findings] == [f"a grant_take of 5 where grant {g.grant_id} had 1 left"]


def test_racing_takes_a_void_and_multi_line_takes_in_both_orders_never_overdraw(conn, plans, connect):
    """Takes of one unit, two-line takes listing their metrics in both orders, and a void, all at once
    against allowances of 0 and grants of 10 per metric: every unit drawn is a unit a grant had, the
    void forfeits exactly what was left, nothing deadlocks, and the ledger agrees."""
    account = new_account(conn, plans)
    set_override(conn, account, "urls", 0)
    set_override(conn, account, "exports", 0)
    urls = _grant(conn, plans, account, 10, "race-u")
    exports = _grant(conn, plans, account, 10, "race-e")
    conns = connect(24)
    orders = ([Line(metric="urls"), Line(metric="exports")], [Line(metric="exports"), Line(metric="urls")])

    numbers = itertools.count(1)  # next() of a count is atomic under the GIL: each racer its own n

    def one(c: Any) -> str:
        n = next(numbers)
        try:
            if n == 12:
                return f"void {grants.void_grant(c, grant_id=urls.grant_id, actor='race').voided}"
            if n % 2:
                takes.take_lines(c, plans, account_id=account, lines=orders[n % 4 == 1], actor="race")
                return "lines"
            takes.take(c, plans, account_id=account, metric="exports", actor="race")
            return "single"
        except QuotaExhausted:
            return "refused"

    results = race(conns, one)

    assert [r for r in results if isinstance(r, BaseException)] == []
    [voided] = [int(str(r).split()[1]) for r in results if str(r).startswith("void")]
    drawn_urls = sum(r["units"] for r in ledger_rows(conn, account, "urls", kind="grant_take"))
    drawn_exports = sum(r["units"] for r in ledger_rows(conn, account, "exports", kind="grant_take"))
    assert drawn_urls + voided == 10 and _remaining(conn, urls.grant_id) == 0
    assert drawn_exports + _remaining(conn, exports.grant_id) == 10
    assert drawn_urls == results.count("lines")
    assert drawn_exports == results.count("lines") + results.count("single")
    _assert_grants_match_ledger(conn, account)
    assert chain.verify(conn, account_id=account).ok


def test_racing_releases_of_a_take_that_drew_on_grants_give_it_back_once(conn, plans, connect):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 1)
    g = _grant(conn, plans, account, 5, "rr")
    t = _take(conn, plans, account, 4)  # 1 from the allowance, 3 from the grant

    results = race(
        connect(8), lambda c: takes.release(c, take_id=t.take_id, actor="race", account_id=account).released
    )

    assert [r for r in results if isinstance(r, BaseException)] == []
    assert results.count(True) == 1
    assert (_remaining(conn, g.grant_id), counter(conn, account, METRIC)["used"]) == (5, 0)
    assert len(ledger_rows(conn, account, METRIC, kind="grant_release")) == 1
    _assert_grants_match_ledger(conn, account)
    assert chain.verify(conn, account_id=account).ok

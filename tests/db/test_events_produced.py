"""Events out, produced (issue 26, docs/events.md): each event is written to event_outbox by the
transaction that caused it, once. Thresholds fire once per (account, metric, period, threshold)
however takes race across them; a rolled-back take produces nothing; a new period re-arms; a release
does not; unlimited metrics fire nothing. Against the real database, as the service's role."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from service.errors import QuotaExhausted
from service.quota import grants, periods, takes
from tests.db.helpers import counter, new_account, set_override
from tests.db.race import race

METRIC = "urls"  # monthly in tests/plans.toml; the plans there keep the default thresholds [80, 100]


def events(conn: Any, account_id: str, type_: str | None = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT type, data, occurred_at FROM event_outbox WHERE account_id = %s"
            " AND (%s::text IS NULL OR type = %s) ORDER BY id",
            (account_id, type_, type_),
        ).fetchall()
    return rows


def crossed(conn: Any, account_id: str) -> list[tuple[str, int, int, int]]:
    """(period, threshold, used, limit) of each quota.threshold_crossed, in order."""
    return [
        (e["data"]["period"], e["data"]["threshold"], e["data"]["used"], e["data"]["limit"])
        for e in events(conn, account_id, "quota.threshold_crossed")
    ]


def take(conn: Any, plans: Any, account_id: str, units: int = 1, **kw: Any) -> takes.Take:
    return takes.take(conn, plans, account_id=account_id, metric=METRIC, units=units, actor="test", **kw)


def test_a_take_below_the_first_threshold_produces_nothing_and_one_reaching_it_produces_one(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)
    for _ in range(7):
        take(conn, plans, account)
    assert crossed(conn, account) == []
    take(conn, plans, account)  # 8 of 10: 80 %
    period = periods.current_period()
    assert crossed(conn, account) == [(period, 80, 8, 10)]
    take(conn, plans, account)
    take(conn, plans, account)  # 10 of 10: 100 % fires at used == limit
    assert crossed(conn, account) == [(period, 80, 8, 10), (period, 100, 10, 10)]
    [event, _] = events(conn, account)
    assert event["data"] == {
        "account_id": account,
        "metric": METRIC,
        "period": period,
        "threshold": 80,
        "used": 8,
        "limit": 10,
        "occurred_at": event["data"]["occurred_at"],
    }
    assert event["data"]["occurred_at"].endswith("Z")


def test_one_take_across_both_thresholds_produces_both(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)
    take(conn, plans, account, units=10)
    assert [t for _, t, _, _ in crossed(conn, account)] == [80, 100]


def test_40_concurrent_takes_across_80_and_100_produce_exactly_one_event_each(conn, plans, connect):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 40)
    conns = connect(40)

    def go(c: Any) -> str:
        try:
            take(c, plans, account)
        except QuotaExhausted:
            return "refused"
        return "granted"

    results = race(conns, go)
    assert results.count("granted") == 40
    assert sorted((t, used) for _, t, used, _ in crossed(conn, account)) == [(80, 32), (100, 40)]


def test_a_rolled_back_take_produces_nothing(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)
    take(conn, plans, account, units=7)

    class Abort(Exception):
        pass

    with pytest.raises(Abort), conn.transaction():
        take(conn, plans, account, units=3)
        assert len(crossed(conn, account)) == 2  # written, in the transaction
        raise Abort
    assert crossed(conn, account) == []
    assert counter(conn, account, METRIC)["used"] == 7
    take(conn, plans, account, units=1)  # the alert line was rolled back with the take
    assert [t for _, t, _, _ in crossed(conn, account)] == [80]


def test_a_release_back_below_does_not_fire_again_in_the_period(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)
    take(conn, plans, account, units=7)
    eighth = take(conn, plans, account)
    takes.release(conn, take_id=eighth.take_id, actor="test", account_id=account)
    assert counter(conn, account, METRIC)["used"] == 7
    take(conn, plans, account)  # 8 again
    assert [t for _, t, _, _ in crossed(conn, account)] == [80]


def test_a_new_period_rearms_the_thresholds(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)
    this = periods.current_period()
    take(conn, plans, account, units=8)
    following = periods.next_period(this)
    take(conn, plans, account, units=8, period=following)  # the lazy rollover opens the next month
    assert [(p, t) for p, t, _, _ in crossed(conn, account)] == [(this, 80), (following, 80)]


def test_unlimited_metrics_and_limits_raised_past_usage_behave(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, None)  # unlimited
    take(conn, plans, account, units=1000)
    assert crossed(conn, account) == []
    set_override(conn, account, METRIC, 2000)
    take(conn, plans, account, units=600)  # 1600 of 2000: 80 %
    assert [(t, used, lim) for _, t, used, lim in crossed(conn, account)] == [(80, 1600, 2000)]


def test_a_multi_line_take_fires_each_line_that_crosses(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)
    set_override(conn, account, "api_calls", 100)
    takes.take_lines(
        conn,
        plans,
        account_id=account,
        actor="test",
        lines=[takes.Line(metric=METRIC, units=9), takes.Line(metric="api_calls", units=50)],
    )
    assert [(e["data"]["metric"], e["data"]["threshold"]) for e in events(conn, account)] == [(METRIC, 80)]


def test_a_take_with_credits_fills_the_allowance_and_fires_100(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)
    take(conn, plans, account, units=7)
    grants.create_grant(
        conn, plans, account_id=account, metric=METRIC, units=5, source="admin", source_ref="k1", actor="test"
    )
    got = take(conn, plans, account, units=5)
    assert got.from_credits == 2
    assert [t for _, t, _, _ in crossed(conn, account)] == [80, 100]


def test_credits_granted_and_voided_are_events(conn, plans):
    account = new_account(conn, plans)
    made = grants.create_grant(
        conn, plans, account_id=account, metric=METRIC, units=5, source="admin", source_ref="k1", actor="test"
    )
    grants.create_grant(  # the same reference again: no second grant, no second event
        conn, plans, account_id=account, metric=METRIC, units=5, source="admin", source_ref="k1", actor="test"
    )
    grants.void_grant(conn, grant_id=made.grant_id, actor="test", account_id=account)
    got = [(e["type"], e["data"]) for e in events(conn, account)]
    assert [t for t, _ in got] == ["credits.granted", "credits.voided"]
    assert got[0][1]["grant_id"] == made.grant_id and got[0][1]["units"] == 5
    assert got[0][1]["source"] == "admin"
    assert got[1][1]["units"] == 5 and got[1][1]["remaining"] == 0


def test_the_service_role_cannot_write_an_event(conn, as_service):
    with as_service(conn), pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(
            "INSERT INTO event_outbox (account_id, type, data) VALUES ('a', 'credits.granted', '{}')"
        )


def test_a_plans_own_thresholds_reach_takes_through_the_sync(conn, plans):
    from service.plans import parse_plans
    from service.quota.alerts import sync_thresholds

    raw = {
        "free_plan": "free",
        "thresholds": [50],
        "plans": {
            "free": {"limits": {METRIC: 10}, "thresholds": [30, 60, 90]},
            "pro": {"limits": {METRIC: 10}},
        },
    }
    custom = parse_plans(raw)
    assert custom.plans["pro"].thresholds == (50,)
    sync_thresholds(conn, custom)
    try:
        account = new_account(conn, plans)  # on the free plan
        set_override(conn, account, METRIC, 10)
        take(conn, plans, account, units=6)
        assert [t for _, t, _, _ in crossed(conn, account)] == [30, 60]
    finally:
        sync_thresholds(conn, plans)
    assert conn.execute("SELECT plan, thresholds FROM plan_thresholds ORDER BY plan").fetchall() == [
        (p, [80, 100]) for p in sorted(plans.plans)
    ]


def test_a_limit_near_the_largest_integer_fires_without_overflow(conn, plans):
    account = new_account(conn, plans)
    huge = 2**63 - 1
    set_override(conn, account, METRIC, huge)
    take(conn, plans, account, units=huge // 100)  # 1 %: the first look at the thresholds
    take(conn, plans, account, units=huge // 100 * 79)
    assert crossed(conn, account) == []
    take(conn, plans, account, units=huge // 100 + 100)  # now at least 80 %
    [(_, threshold, used, limit)] = crossed(conn, account)
    assert (threshold, limit) == (80, huge) and used * 100 >= 80 * huge


def test_a_take_before_the_thresholds_are_synced_keeps_the_line_for_the_next(conn, plans):
    from service.quota.alerts import sync_thresholds

    account = new_account(conn, plans)  # on the free plan
    set_override(conn, account, METRIC, 10)
    conn.execute("DELETE FROM plan_thresholds WHERE plan = 'free'")
    try:
        take(conn, plans, account, units=9)
        assert crossed(conn, account) == []
    finally:
        sync_thresholds(conn, plans)
    take(conn, plans, account)  # 10 of 10: both thresholds, now that the plan has them
    assert [t for _, t, _, _ in crossed(conn, account)] == [80, 100]

"""Metrics of every kind (tests/plans.toml): `seats` an allocation, held until released and never
reset; `exports` a consumable reset every UTC day; `urls` the monthly consumable. Each keeps the
monthly counter's guarantees: no overshoot under concurrency, counter = ledger, one reset per period."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from service.errors import MetricKindChanged, NotResettable, QuotaExhausted
from service.plans import parse_plans
from service.quota import accounts, admin, chain, check, ledger, periods, reset, takes, usage
from tests.db.conftest import THREADS
from tests.db.helpers import (
    assert_counter_matches_ledger,
    counter,
    ledger_rows,
    ledger_used,
    new_account,
    set_override,
)
from tests.db.race import race

NOV_30 = datetime(2026, 11, 30, 23, 59, tzinfo=UTC)
DEC_1 = datetime(2026, 12, 1, 0, 1, tzinfo=UTC)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The service clock, set by the test (periods.now is what every default period reads)."""

    class Clock:
        at = NOV_30

        def set(self, at: datetime) -> None:
            self.at = at

    c = Clock()
    monkeypatch.setattr(periods, "now", lambda: c.at)
    return c


def _take(conn: Any, plans: Any, account: str, metric: str, units: int = 1) -> takes.Take:
    return takes.take(conn, plans, account_id=account, metric=metric, units=units, actor="t")


# --- allocations -------------------------------------------------------------------------------


def test_50_concurrent_seat_takes_against_limit_10_grant_exactly_10(conn, plans, connect):
    account = new_account(conn, plans)
    set_override(conn, account, "seats", 10)

    def one(c: Any) -> str:
        try:
            takes.take(c, plans, account_id=account, metric="seats", actor="race")
        except QuotaExhausted:
            return "refused"
        return "granted"

    results = race(connect(THREADS), one)

    assert [r for r in results if isinstance(r, BaseException)] == []
    assert results.count("granted") == 10
    assert counter(conn, account, "seats")["used"] == 10
    assert counter(conn, account, "seats")["period"] == periods.HELD
    assert_counter_matches_ledger(conn, account, "seats")


def test_a_seat_taken_in_november_is_released_in_december_and_never_reset(conn, plans, clock):
    account = new_account(conn, plans)
    set_override(conn, account, "seats", 5)
    seat = _take(conn, plans, account, "seats", 2)
    assert seat.period is None  # an allocation has no period

    clock.set(DEC_1)
    assert reset.reset_month(conn, period="2026-12", duty=1.0).status == "done"
    assert reset.reset_day(conn, day="2026-12-01", duty=1.0).status == "done"
    _take(conn, plans, account, "urls")  # the lazy rollover of another metric
    assert counter(conn, account, "seats")["used"] == 2  # held across the month's start

    given = takes.release(conn, take_id=seat.take_id, actor="t")
    assert given.released and given.units == 2 and given.used == 0
    again = takes.release(conn, take_id=seat.take_id, actor="t")
    assert not again.released and again.reason == "already_released"
    assert [r["kind"] for r in ledger_rows(conn, account, "seats")] == ["take", "release"]  # no reset row
    assert_counter_matches_ledger(conn, account, "seats")


def test_an_admin_reset_of_an_allocation_is_refused(conn, plans):
    account = new_account(conn, plans)
    _take(conn, plans, account, "seats")
    with pytest.raises(NotResettable):
        admin.reset_counter(conn, plans, account_id=account, metric="seats", actor="admin")
    assert counter(conn, account, "seats")["used"] == 1


def test_a_downgrade_below_what_is_held_keeps_it_and_refuses_new_seats(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, "seats", 3)
    _take(conn, plans, account, "seats", 3)
    set_override(conn, account, "seats", 1)  # as a downgrade lowers the limit

    with pytest.raises(QuotaExhausted):
        _take(conn, plans, account, "seats")
    seats = accounts.get_account(conn, plans, account_id=account).by_metric["seats"]
    assert (seats.used, seats.limit, seats.remaining, seats.over_limit) == (3, 1, 0, True)
    assert (seats.period, seats.resets_at, seats.kind, seats.reset) == (None, None, "allocation", None)


def test_usage_of_an_allocation_is_what_is_held_now(conn, plans):
    account = new_account(conn, plans)
    t = _take(conn, plans, account, "seats")
    assert usage.usage(conn, plans, account_id=account, metric="seats") == 1
    takes.release(conn, take_id=t.take_id, actor="t")
    assert usage.usage(conn, plans, account_id=account, metric="seats") == 0


def test_the_allocations_reconcile_as_all_their_takes_minus_releases(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, "seats", 5)
    kept = _take(conn, plans, account, "seats", 2)
    given = _take(conn, plans, account, "seats", 1)
    takes.release(conn, take_id=given.take_id, actor="t")

    result = ledger.reconcile(conn, period=periods.HELD)
    mine = [m for m in result.mismatches if m.account_id == account]
    assert result.checked >= 1 and mine == []
    assert counter(conn, account, "seats")["used"] == 2 == kept.units
    assert ledger_used(conn, account, "seats", periods.HELD) == 2


# --- daily consumables ---------------------------------------------------------------------------


def test_a_daily_counter_starts_from_zero_after_midnight(conn, plans, clock):
    account = new_account(conn, plans)  # free: exports = 3 a day
    for _ in range(3):
        t = _take(conn, plans, account, "exports")
    assert t.period == "2026-11-30"
    with pytest.raises(QuotaExhausted):
        _take(conn, plans, account, "exports")

    clock.set(DEC_1)
    t = _take(conn, plans, account, "exports")
    assert (t.period, t.used) == ("2026-12-01", 1)
    opened = [r for r in ledger_rows(conn, account, "exports") if r["kind"] == "reset"]
    assert [(r["period"], r["units"], r["idempotency_key"]) for r in opened] == [
        ("2026-12-01", 3, "period-open:2026-12-01")
    ]
    assert usage.usage(conn, plans, account_id=account, metric="exports", period="2026-11-30") == 3
    assert usage.usage(conn, plans, account_id=account, metric="exports") == 1
    assert_counter_matches_ledger(conn, account, "exports")


def test_a_take_of_yesterday_is_not_released_today(conn, plans, clock):
    account = new_account(conn, plans)
    t = _take(conn, plans, account, "exports")
    clock.set(DEC_1)
    out = takes.release(conn, take_id=t.take_id, actor="t")
    assert not out.released and out.reason == "period_closed" and out.period == "2026-11-30"


def test_the_daily_job_resets_untouched_counters_once_and_leaves_the_others(conn, plans, clock):
    account = new_account(conn, plans)
    _take(conn, plans, account, "exports", 2)
    _take(conn, plans, account, "urls", 2)
    _take(conn, plans, account, "seats")

    clock.set(DEC_1)
    first = reset.reset_day(conn, duty=1.0)
    again = reset.reset_day(conn, duty=1.0)

    assert (first.status, again.status) == ("done", "already_done")
    assert (counter(conn, account, "exports")["period"], counter(conn, account, "exports")["used"]) == (
        "2026-12-01",
        0,
    )
    assert counter(conn, account, "urls")["period"] == "2026-11"  # the monthly job's, not the daily's
    assert counter(conn, account, "seats")["used"] == 1
    resets = [r for r in ledger_rows(conn, account) if r["kind"] == "reset"]
    assert [(r["metric"], r["period"], r["actor"]) for r in resets] == [
        ("exports", "2026-12-01", reset.DAILY.actor)
    ]
    assert_counter_matches_ledger(conn, account, "exports")


def test_the_monthly_job_leaves_daily_counters_and_allocations_alone(conn, plans, clock):
    account = new_account(conn, plans)
    _take(conn, plans, account, "exports", 2)
    _take(conn, plans, account, "seats")
    _take(conn, plans, account, "urls", 4)

    clock.set(DEC_1)
    assert reset.reset_month(conn, duty=1.0).status == "done"

    assert (counter(conn, account, "urls")["period"], counter(conn, account, "urls")["used"]) == (
        "2026-12",
        0,
    )
    assert counter(conn, account, "exports")["period"] == "2026-11-30"
    assert counter(conn, account, "seats")["used"] == 1


def test_the_daily_job_catches_up_a_missed_day(conn, plans, clock):
    account = new_account(conn, plans)
    _take(conn, plans, account, "exports", 2)
    clock.set(datetime(2026, 12, 3, 9, tzinfo=UTC))  # Dec 1 and 2 were missed

    outcome = reset.catch_up(conn, cadence=reset.DAILY, duty=1.0)

    assert (outcome.status, outcome.period) == ("done", "2026-12-03")
    assert counter(conn, account, "exports")["period"] == "2026-12-03"
    assert reset.catch_up(conn, cadence=reset.DAILY).status == "already_done"
    assert_counter_matches_ledger(conn, account, "exports")


def test_an_admin_reset_of_a_daily_counter_clears_today(conn, plans, clock):
    account = new_account(conn, plans)
    _take(conn, plans, account, "exports", 2)
    assert admin.reset_counter(conn, plans, account_id=account, metric="exports", actor="admin") == 2
    assert (counter(conn, account, "exports")["period"], counter(conn, account, "exports")["used"]) == (
        "2026-11-30",
        0,
    )


def test_a_months_export_and_reconciliation_include_its_days(conn, plans, clock):
    account = new_account(conn, plans)
    _take(conn, plans, account, "exports", 2)
    _take(conn, plans, account, "urls", 1)
    clock.set(DEC_1)
    _take(conn, plans, account, "exports")  # opens the 1st: not November's

    exported = [r for r in ledger.period_rows(conn, period="2026-11") if r.account_id == account]
    assert [(r.metric, r.period, r.kind) for r in exported] == [
        ("urls", "2026-11", "take"),
        ("exports", "2026-11-30", "take"),
    ]
    result = ledger.reconcile(conn, period="2026-11")
    assert [m for m in result.mismatches if m.account_id == account] == []
    assert ledger.reconcile(conn, period="2026-12-01").ok


# --- a metric whose kind changes -----------------------------------------------------------------


def _with_kinds(plans: Any, metrics: dict[str, Any]) -> Any:
    return parse_plans(
        {
            "free_plan": plans.free_plan,
            "metrics": metrics,
            "plans": {
                p.name: {"limits": {m: "unlimited" if v is None else v for m, v in p.limits.items()}}
                for p in plans.plans.values()
            },
        }
    )


def test_a_counter_holding_usage_of_the_old_kind_refuses_takes_and_moves_nothing(conn, plans):
    account = new_account(conn, plans)
    _take(conn, plans, account, "urls", 2)  # monthly
    daily = _with_kinds(plans, {"seats": {"kind": "allocation"}, "urls": {"reset": "day"}})
    before = ledger_rows(conn, account, "urls")

    with pytest.raises(MetricKindChanged):
        _take(conn, daily, account, "urls")
    with pytest.raises(MetricKindChanged):  # the check answers as the take would
        check.check_metric(conn, daily, account_id=account, metric="urls")

    assert ledger_rows(conn, account, "urls") == before
    assert counter(conn, account, "urls")["used"] == 2


def test_an_empty_counter_follows_its_metrics_new_kind(conn, plans):
    account = new_account(conn, plans)
    t = _take(conn, plans, account, "urls")
    takes.release(conn, take_id=t.take_id, actor="t")
    held = _with_kinds(plans, {"seats": {"kind": "allocation"}, "urls": {"kind": "allocation"}})

    assert check.check_metric(conn, held, account_id=account, metric="urls").period is None
    took = _take(conn, held, account, "urls")

    assert took.period is None and counter(conn, account, "urls")["period"] == periods.HELD
    assert chain.verify(conn, account_id=account).ok

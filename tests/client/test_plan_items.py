"""The client's contract for the three kinds of metric, the check and boolean features, run against
the real service and InMemoryQuota alike (tests/plans.toml's free plan: `seats` an allocation of 1,
`exports` 3 a UTC day, `urls` 50 a month; `export_csv` on, the other features off). The clock is the
backend's (`set_now`): the service runs in this process, so both sides cross a midnight for real."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from quota_client import (
    AccountDeletedError,
    FeatureCheck,
    MetricCheck,
    UnknownAccountError,
    ValidationError,
)

from tests.client.conftest import PLANS

JAN_31 = datetime(2027, 1, 31, 23, 59, tzinfo=UTC)
FEB_1 = datetime(2027, 2, 1, 0, 1, tzinfo=UTC)
MAR_15 = datetime(2027, 3, 15, 12, 0, tzinfo=UTC)


def test_the_view_says_each_metrics_kind_and_period(quota, backend, acc):
    backend.set_now(JAN_31)
    quota.ensure_account(acc)
    quota.take(acc, "seats")
    limits = quota.limits(acc)
    seats, exports, urls = limits["seats"], limits["exports"], limits["urls"]
    assert (seats.kind, seats.reset, seats.period, seats.resets_at) == ("allocation", None, None, None)
    assert (seats.used, seats.limit, seats.remaining, seats.over_limit) == (1, 1, 0, False)
    assert (exports.kind, exports.reset, exports.period) == ("consumable", "day", "2027-01-31")
    assert exports.resets_at == "2027-02-01T00:00:00Z"
    assert (urls.kind, urls.reset, urls.period, urls.resets_at) == (
        "consumable",
        "month",
        "2027-01",
        "2027-02-01T00:00:00Z",
    )


def test_a_seat_is_held_across_the_month_and_released_later(quota, backend, acc):
    backend.set_now(JAN_31)
    quota.ensure_account(acc)
    seat = quota.take(acc, "seats")
    assert (seat.granted, seat.period, seat.used, seat.remaining) == (True, None, 1, 0)
    export = quota.take(acc, "exports")

    backend.set_now(FEB_1)
    assert quota.take(acc, "urls").period == "2027-02"  # a new month has begun
    assert not quota.take(acc, "seats").granted  # the seat is still held: nothing reset it
    assert quota.limits(acc)["seats"].used == 1
    held = quota.usage(acc, "seats")
    assert (held.period, held.used) == (None, 1)
    assert quota.release(export).reason == "period_closed"  # yesterday's export, unlike the seat

    backend.set_now(MAR_15)
    given = quota.release(seat)
    assert (given.released, given.units, given.used, given.period) == (True, 1, 0, None)
    assert quota.release(seat).reason == "already_released"
    assert quota.usage(acc, "seats").used == 0
    with pytest.raises(ValidationError) as e:
        quota.usage(acc, "seats", period="2027-03")  # an allocation has no period
    assert set(e.value.fields) == {"period"}


def test_an_allocation_over_its_limit_shows_it_and_refuses_takes(quota, backend, acc):
    quota.ensure_account(acc)
    backend.set_limit(acc, "seats", 3)
    quota.take(acc, "seats", units=3)
    backend.set_limit(acc, "seats", 1)  # as a downgrade lowers it: what is held stays held
    seats = quota.limits(acc)["seats"]
    assert (seats.used, seats.limit, seats.remaining, seats.over_limit) == (3, 1, 0, True)
    assert not quota.take(acc, "seats").granted
    assert not quota.check(acc, "seats").allowed


def test_a_daily_counter_starts_from_zero_after_midnight(quota, backend, acc):
    backend.set_now(JAN_31)
    quota.ensure_account(acc)
    took = [quota.take(acc, "exports") for _ in range(3)]
    assert [t.period for t in took] == ["2027-01-31"] * 3
    refused = quota.take(acc, "exports")
    assert (refused.granted, refused.used, refused.remaining, refused.period) == (False, 3, 0, "2027-01-31")

    backend.set_now(FEB_1)
    today = quota.take(acc, "exports")
    assert (today.granted, today.used, today.remaining, today.period) == (True, 1, 2, "2027-02-01")
    assert quota.limits(acc)["exports"].resets_at == "2027-02-02T00:00:00Z"
    assert quota.usage(acc, "exports").used == 1  # a daily metric's usage defaults to today
    assert quota.usage(acc, "exports", period="2027-01-31").used == 3
    assert quota.release(took[0]).reason == "period_closed"
    assert quota.release(today).released
    with pytest.raises(ValidationError) as e:
        quota.usage(acc, "exports", period="2027-02")  # a month is not a daily metric's period
    assert (e.value.status, set(e.value.fields)) == (422, {"period"})


def test_check_agrees_with_take_and_takes_nothing(quota, backend, acc):
    quota.ensure_account(acc)
    backend.set_limit(acc, "urls", 3)
    before = quota.check(acc, "urls", units=2)
    assert isinstance(before, MetricCheck) and before.allowed
    took = quota.take(acc, "urls", units=2)
    assert (before.used, before.limit, before.remaining, before.limit_source, before.period) == (
        0,
        took.limit,
        3,
        took.limit_source,
        took.period,
    )
    assert before.resets_at == quota.limits(acc)["urls"].resets_at

    after = quota.check(acc, "urls", units=2)
    assert (after.allowed, after.units, after.used, after.remaining) == (False, 2, 2, 1)
    assert not quota.take(acc, "urls", units=2).granted
    assert quota.check(acc, "urls").allowed and quota.take(acc, "urls").granted
    assert not quota.check(acc, "urls").allowed
    assert quota.usage(acc, "urls").used == 3  # checks took nothing

    seat = quota.check(acc, "seats")
    assert (seat.allowed, seat.period, seat.resets_at, seat.limit) == (True, None, None, 1)
    backend.set_limit(acc, "api_calls", None)
    unlimited = quota.check(acc, "api_calls", units=10**6)
    assert (unlimited.allowed, unlimited.limit, unlimited.remaining) == (True, None, None)


def test_check_refusals(quota, backend, acc):
    quota.ensure_account(acc)
    with pytest.raises(ValidationError) as e:
        quota.check(acc, "bananas")
    assert (e.value.status, e.value.code) == (422, "unknown_metric")
    with pytest.raises(ValidationError) as e:
        quota.check(acc, "urls", units=0)
    assert (e.value.code, set(e.value.fields)) == ("validation_failed", {"units"})
    with pytest.raises(ValidationError) as e:
        quota.check_feature(acc, "teleport")
    assert (e.value.status, e.value.code) == (422, "unknown_feature")
    for call in (lambda: quota.check("nobody", "urls"), lambda: quota.feature_enabled("nobody", "sso")):
        with pytest.raises(UnknownAccountError):
            call()
    backend.delete(acc)
    for call in (lambda: quota.check(acc, "urls"), lambda: quota.feature_enabled(acc, "export_csv")):
        with pytest.raises(AccountDeletedError):
            call()


def test_features_follow_the_plan_and_an_override_wins(quota, backend, acc):
    quota.ensure_account(acc)
    features = quota.account(acc).features
    assert set(features) == set(PLANS.features)
    assert {n: (f.enabled, f.source) for n, f in features.items() if f.enabled} == {
        "export_csv": (True, "plan")
    }
    assert quota.feature_enabled(acc, "export_csv") and not quota.feature_enabled(acc, "sso")
    assert quota.check_feature(acc, "sso") == FeatureCheck(allowed=False, feature="sso", source="plan")

    backend.set_feature(acc, "sso", True)
    backend.set_feature(acc, "export_csv", False)
    assert quota.check_feature(acc, "sso") == FeatureCheck(allowed=True, feature="sso", source="override")
    assert not quota.feature_enabled(acc, "export_csv")
    view = quota.account(acc).features
    assert (view["sso"].enabled, view["sso"].source, view["export_csv"].enabled) == (True, "override", False)

    backend.set_feature(acc, "sso", None)
    assert quota.check_feature(acc, "sso").source == "plan" and not quota.feature_enabled(acc, "sso")


@pytest.mark.anyio
async def test_the_async_client_checks_too(backend, acc):
    async with backend.async_client() as quota:
        await quota.ensure_account(acc)
        checked = await quota.check(acc, "exports", units=3)
        assert (checked.allowed, checked.remaining) == (True, 3)
        assert not (await quota.check(acc, "exports", units=4)).allowed
        assert await quota.feature_enabled(acc, "export_csv")
        assert (await quota.check_feature(acc, "api_access")).source == "plan"

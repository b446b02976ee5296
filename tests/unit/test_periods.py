"""Periods are UTC calendar months, YYYY-MM."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from service.quota import periods


def test_period_of_is_utc():
    assert periods.period_of(datetime(2025, 1, 31, 23, 59, 59, tzinfo=UTC)) == "2025-01"
    assert periods.period_of(datetime(2025, 2, 1, 0, 0, tzinfo=UTC)) == "2025-02"
    # 1 February 01:00 in UTC+2 is still 31 January in UTC
    assert periods.period_of(datetime(2025, 2, 1, 1, 0, tzinfo=timezone(timedelta(hours=2)))) == "2025-01"
    # 31 January 20:00 in UTC-5 is already 1 February in UTC
    assert periods.period_of(datetime(2025, 1, 31, 20, 0, tzinfo=timezone(timedelta(hours=-5)))) == "2025-02"


def test_next_period_and_resets_at():
    assert periods.next_period("2024-12") == "2025-01"
    assert periods.next_period("2024-01") == "2024-02"
    assert periods.next_period("0999-11") == "0999-12"
    assert periods.resets_at("2024-02") == "2024-03-01T00:00:00Z"
    assert periods.resets_at("2024-12") == "2025-01-01T00:00:00Z"


def test_is_period():
    for good in ("2024-01", "2024-12", "0001-09"):
        assert periods.is_period(good)
    for bad in (
        "2024-00",
        "2024-13",
        "2024-1",
        "24-01",
        "2024/01",
        "2024-01\n",
        " 2024-01",
        "2024-01-01",
        "",
    ):
        assert not periods.is_period(bad), bad


def test_current_period_is_now():
    assert periods.current_period() == periods.period_of(datetime.now(UTC))


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9998, 12, 1), timezones=st.just(UTC)))
def test_periods_are_ordered_like_time_and_strings(at):
    p = periods.period_of(at)
    n = periods.next_period(p)
    assert periods.is_period(p) and periods.is_period(n)
    assert p < n, "string order is time order (the SQL compares periods as text)"
    assert periods.period_start(p) <= at < periods.period_start(n)
    assert periods.period_of(periods.period_start(n) - timedelta(microseconds=1)) == p

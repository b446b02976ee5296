"""The console plot's window and scale, and the period rule the usage history uses (pure functions)."""

from __future__ import annotations

from datetime import date

from service.console import plot
from service.quota import periods
from service.quota.history import DayUsage


def test_a_counter_is_in_its_period_while_the_period_lasts():
    assert periods.covers("2026-11", "2026-11-30")
    assert not periods.covers("2026-11", "2026-12-01")
    assert periods.covers("2026-11-30", "2026-11-30")
    assert not periods.covers("2026-11-30", "2026-12-01")
    assert periods.covers(periods.HELD, "2030-01-01")


def test_the_window_is_two_months_two_weeks_or_two_months_of_days():
    assert plot.window("consumable", "month", date(2026, 3, 15)) == (date(2026, 2, 1), date(2026, 3, 15))
    assert plot.window("consumable", "month", date(2026, 1, 1)) == (date(2025, 12, 1), date(2026, 1, 1))
    assert plot.window("consumable", "day", date(2026, 3, 15)) == (date(2026, 3, 2), date(2026, 3, 15))
    assert plot.window("allocation", None, date(2026, 3, 15))[0] == date(2026, 1, 15)


def test_points_follow_the_days_and_the_limit_shows_when_within_reach():
    days = [
        DayUsage(date=date(2026, 3, d), taken=t, released=0, used=u) for d, t, u in ((1, 3, 3), (2, 0, 3))
    ]
    near = plot.plot("urls", days, limit=5, current_start=date(2026, 3, 2))
    assert near.top == 5 and near.limit_y is not None and near.period_x is not None
    assert [p.day for p in near.points] == days and near.points[0].y == near.points[1].y
    far = plot.plot("urls", days, limit=1000, current_start=None)
    assert far.top == 5 and far.limit_y is None and far.period_x is None
    assert plot.plot("urls", days, limit=None, current_start=None).top == 5

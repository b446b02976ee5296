"""An account's daily usage of one metric, read from the ledger: per UTC day the units taken and
released, and `used`, the counter as the day ended.

The counter at a day's end is its last ledger row's `used_after` up to then, while that row's period
is still the counter's period on that day (periods.covers): a month's usage stops counting when
the month ends whether or not its reset row was written yet (the lazy rollover writes it with the
month's first take), a daily metric's at the end of its day, and an allocation's (`held`) never. A
reset row moves `used_after` to 0 like any other row, so admin resets show as they happened."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from psycopg.rows import dict_row

from service.db import Connection, Q
from service.quota import periods

MAX_DAYS = 400  # a little over a year: two periods of a yearly view, one request


@dataclass(frozen=True, kw_only=True)
class DayUsage:
    date: date
    taken: int
    released: int
    used: int


def _start(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def daily_usage(conn: Connection, *, account_id: str, metric: str, first: date, last: date) -> list[DayUsage]:
    """One DayUsage per day from `first` to `last` (both included; at most MAX_DAYS, the caller
    checks), zeros where nothing moved. Two statements on the ledger_history index; no account check
    (an account without rows has zeros)."""
    params = {"account_id": account_id, "metric": metric, "start": _start(first)}
    with conn.cursor(row_factory=dict_row) as cur:
        before = cur.execute(Q.usage_history_before, params).fetchone()
        rows = cur.execute(
            Q.usage_history_days, {**params, "end": _start(last + timedelta(days=1))}
        ).fetchall()
    moved = {r["day"]: r for r in rows}
    held, period = (before["used_after"], before["period"]) if before else (0, None)
    days = []
    day = first
    while day <= last:
        row = moved.get(day)
        if row is not None:
            held, period = row["used_after"], row["period"]
        used = held if period is not None and periods.covers(period, day.isoformat()) else 0
        days.append(
            DayUsage(
                date=day,
                taken=row["taken"] if row else 0,
                released=row["released"] if row else 0,
                used=used,
            )
        )
        day += timedelta(days=1)
    return days

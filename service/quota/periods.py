"""Periods, as counters and ledger rows name them: a calendar month in UTC (YYYY-MM), a UTC day
(YYYY-MM-DD) for a consumable reset daily, and HELD for an allocation, which has none.

The three sort apart as strings, which the resets rely on: a month's days sort between the month and
the next month ('2026-11' < '2026-11-30' < '2026-12'), and HELD after every date, so no
`period < P` ever matches an allocation's counter."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

# Anchored as JSON Schema reads a pattern, so that the OpenAPI document can quote it; used with
# fullmatch() only, because Python's `$` also matches before a trailing newline.
PERIOD_RE = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])$")
DAY_RE = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$")
# Either: the periods a usage query may name.
MONTH_OR_DAY_RE = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?$")
# The period of an allocation's counter and ledger rows.
HELD = "held"
# Any: what finance's reads of the ledger (pages, export, reconciliation) may name.
LEDGER_PERIOD_RE = re.compile(r"^(held|[0-9]{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?)$")


def now() -> datetime:
    """The service clock (UTC). Tests that need another day pass `at=` explicitly instead."""
    return datetime.now(UTC)


def period_of(at: datetime) -> str:
    at = at.astimezone(UTC)
    return f"{at.year:04d}-{at.month:02d}"


def day_of(at: datetime) -> str:
    return at.astimezone(UTC).date().isoformat()


def current_period() -> str:
    return period_of(now())


def next_period(period: str) -> str:
    year, month = int(period[:4]), int(period[5:])
    return f"{year + month // 12:04d}-{month % 12 + 1:02d}"


def period_start(period: str) -> datetime:
    return datetime(int(period[:4]), int(period[5:]), 1, tzinfo=UTC)


def day_start(day: str) -> datetime:
    return datetime.fromisoformat(day).replace(tzinfo=UTC)


def resets_at(period: str) -> str | None:
    """When `period` (a month or a day) ends and the next one starts from zero, as an ISO 8601 UTC
    timestamp; None for HELD, which never resets."""
    if period == HELD:
        return None
    end = day_start(period) + timedelta(days=1) if is_day(period) else period_start(next_period(period))
    return end.isoformat().replace("+00:00", "Z")


def shown(period: str) -> str | None:
    """A period as the API shows it: None for HELD (an allocation has no period)."""
    return None if period == HELD else period


def same_kind(a: str, b: str) -> bool:
    """Both months, both days, or both HELD: the periods that compare in time."""
    return len(a) == len(b)


def covers(period: str, day: str) -> bool:
    """Whether a counter in `period` is still in it on `day` (YYYY-MM-DD): the month of the day, the
    day itself, or HELD, which never ends."""
    return period in (HELD, day, day[:7])


def is_period(s: str) -> bool:
    return bool(PERIOD_RE.fullmatch(s))


def is_day(s: str) -> bool:
    """A real UTC day written YYYY-MM-DD (2026-02-30 is not one)."""
    if not DAY_RE.fullmatch(s):
        return False
    try:
        datetime.fromisoformat(s)
    except ValueError:
        return False
    return True

"""Periods are calendar months in UTC, written YYYY-MM."""

from __future__ import annotations

import re
from datetime import UTC, datetime

# Anchored as JSON Schema reads a pattern, so that the OpenAPI document can quote it; used with
# fullmatch() only, because Python's `$` also matches before a trailing newline.
PERIOD_RE = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])$")


def now() -> datetime:
    """The service clock (UTC). Tests that need another day pass `at=` explicitly instead."""
    return datetime.now(UTC)


def period_of(at: datetime) -> str:
    at = at.astimezone(UTC)
    return f"{at.year:04d}-{at.month:02d}"


def current_period() -> str:
    return period_of(now())


def next_period(period: str) -> str:
    year, month = int(period[:4]), int(period[5:])
    return f"{year + month // 12:04d}-{month % 12 + 1:02d}"


def period_start(period: str) -> datetime:
    return datetime(int(period[:4]), int(period[5:]), 1, tzinfo=UTC)


def resets_at(period: str) -> str:
    """When `period` ends and the next one starts from zero, as an ISO 8601 UTC timestamp."""
    return period_start(next_period(period)).isoformat().replace("+00:00", "Z")


def is_period(s: str) -> bool:
    return bool(PERIOD_RE.fullmatch(s))

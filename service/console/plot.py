"""The usage plot's geometry: per day a bar of the units taken and a point of the counter at the
day's end (service/quota/history.py), scaled into an SVG drawn by the account page's template. No
script: each point's numbers are its <title> (a tooltip) and its data-* attributes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

from service.quota import periods
from service.quota.history import DayUsage

WIDTH, HEIGHT = 640, 180
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 12, 26


@dataclass(frozen=True, kw_only=True)
class Point:
    day: DayUsage
    x: float
    y: float
    bar_y: float
    bar_height: float


@dataclass(frozen=True, kw_only=True)
class Plot:
    metric: str
    first: date
    last: date
    points: list[Point]
    bar_width: float
    top: int  # the y axis' top value
    limit_y: float | None  # the limit's line, when limited and in view
    period_x: float | None  # where the current period starts, when inside the range
    period_label_end: bool  # the label left of that line (it is near the right edge)
    ticks: list[tuple[float, str]]  # x, label (the first of each month, or a few days)

    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    plot_top: int = TOP
    bottom: int = HEIGHT - BOTTOM

    @property
    def line(self) -> str:
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.points)


def window(kind: str, reset: str | None, today: date) -> tuple[date, date]:
    """The days a metric's plot shows: the previous and current month of a monthly metric, the last
    14 days of a daily one, the last 60 of an allocation."""
    if reset == "month":
        start = periods.period_start(periods.period_of(periods.day_start(today.isoformat())))
        return (start - timedelta(days=1)).date().replace(day=1), today
    return today - timedelta(days=13 if reset == "day" else 59), today


def plot(metric: str, days: list[DayUsage], *, limit: int | None, current_start: date | None) -> Plot:
    most = max([d.used for d in days] + [d.taken for d in days] + [1])
    # The limit is drawn when it is within reach (twice the most used or taken, at most): further
    # up it would flatten the usage it is there to compare with.
    if limit is not None and limit <= 2 * most:
        most = max(most, limit)
    top = _nice(most)
    span = HEIGHT - BOTTOM - TOP
    step = (WIDTH - RIGHT - LEFT) / max(len(days), 1)

    def y(v: int) -> float:
        return HEIGHT - BOTTOM - span * v / top

    points = [
        Point(
            day=d,
            x=LEFT + step * (i + 0.5),
            y=y(d.used),
            bar_y=y(d.taken),
            bar_height=HEIGHT - BOTTOM - y(d.taken),
        )
        for i, d in enumerate(days)
    ]
    first, last = days[0].date, days[-1].date
    period_x = None
    if current_start is not None and first < current_start <= last:
        period_x = LEFT + step * (current_start - first).days
    every = max(len(days) // 6, 1)
    ticks = [
        (p.x, p.day.date.strftime("%b %-d"))
        for i, p in enumerate(points)
        if (p.day.date.day == 1 if len(days) > 31 else i % every == 0)
    ]
    return Plot(
        metric=metric,
        first=first,
        last=last,
        points=points,
        bar_width=max(step * 0.6, 1.0),
        top=top,
        limit_y=y(limit) if limit is not None and limit <= top else None,
        period_x=period_x,
        period_label_end=period_x is not None and period_x > WIDTH - RIGHT - 90,
        ticks=ticks,
    )


def _nice(v: int) -> int:
    """The next round number at or above `v` (1, 2, 5 times a power of ten)."""
    n = 1
    while True:
        for m in (1, 2, 5):
            if n * m >= v:
                return n * m
        n *= 10

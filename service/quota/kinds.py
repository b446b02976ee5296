"""A metric whose kind or reset changes in the plan config (a monthly consumable made daily, a
consumable made an allocation, or back). A counter that holds nothing follows the new kind by itself
on its next take. One that holds usage counted the old way is never converted silently, which would
lose or double it: its takes and releases are refused (MetricKindChanged), the plan sync refuses to
run, until `quota-ledger convert-metric` closes it. README, "Plan items"."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psycopg.rows import class_row

from service.db import Connection, Q
from service.errors import MetricKindChanged
from service.plans import PlanConfig
from service.quota.accounts import require_metric
from service.quota.takes import roll_over

ACTOR = "system:convert_metric"


@dataclass(frozen=True, kw_only=True)
class Conflict:
    """The counters of `metric` that hold `used` units counted as another kind than the config's."""

    metric: str
    counters: int
    used: int

    def describe(self) -> str:
        return (
            f"{self.metric}: {self.counters} counters hold {self.used} units counted as another kind than "
            f"the plan config's; run `quota-ledger convert-metric {self.metric}`"
        )


def conflicts(conn: Connection, plans: PlanConfig) -> list[Conflict]:
    """Every metric with counters that hold usage counted as another kind than the config says."""
    metrics = list(plans.metrics)
    params = {"metrics": metrics, "widths": [len(plans.period(m)) for m in metrics]}
    with conn.cursor(row_factory=class_row(Conflict)) as cur:
        return cur.execute(Q.kind_conflicts, params).fetchall()


def refuse_conflicts(conn: Connection, plans: PlanConfig) -> None:
    """MetricKindChanged naming every metric with counters to convert first; nothing otherwise."""
    found = conflicts(conn, plans)
    if found:
        raise MetricKindChanged("; ".join(c.describe() for c in found))


def convert(
    conn: Connection,
    plans: PlanConfig,
    *,
    metric: str,
    batch_size: int = 1000,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Open the metric's current period on each of its counters counted as another kind (deleted
    accounts' too): what a counter held is cleared by a period-open reset row, as at a period's
    start, so the ledger keeps it under the old period and the counter starts the new kind from
    zero. Returns the counters converted. Needs an autocommit connection (one statement each)."""
    require_metric(plans, metric)
    period = plans.period(metric)
    params: dict[str, object] = {"metric": metric, "width": len(period), "batch_size": batch_size}
    after, done = "", 0
    while True:
        found = [str(r[0]) for r in conn.execute(Q.kind_converts, {**params, "after": after}).fetchall()]
        if not found:
            return done
        for account_id in found:
            roll_over(conn, account_id=account_id, metric=metric, period=period, actor=ACTOR)
        after, done = found[-1], done + len(found)
        if on_progress is not None:
            on_progress(done)

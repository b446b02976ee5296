"""Usage of a metric in a period: the counter for the open period, the ledger for closed ones."""

from __future__ import annotations

from psycopg.rows import dict_row

from service.db import Connection, Q
from service.plans import PlanConfig
from service.quota.accounts import find_account, require_metric


def usage(
    conn: Connection, plans: PlanConfig, *, account_id: str, metric: str, period: str | None = None
) -> int:
    """Units used in `period` (default: the metric's current one: this month, today, or HELD for an
    allocation, whose usage is what is held now). A period with no usage is 0. An unknown metric
    raises UnknownMetric, as a take of it would. `period` is of the metric's kind (the caller checks)."""
    require_metric(plans, metric)
    current = plans.period(metric)
    period = period or current
    find_account(conn, account_id=account_id)  # UnknownAccount
    params = {"account_id": account_id, "metric": metric, "period": period}
    query = Q.usage_open if period >= current else Q.usage_from_ledger
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query, params).fetchone()
    return int(row["used"]) if row else 0

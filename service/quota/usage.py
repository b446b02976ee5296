"""Usage of a metric in a period: the counter for the open period, the ledger for closed ones."""

from __future__ import annotations

from service.billing.plans import PlanConfig
from service.db import Connection, Q
from service.errors import UnknownAccount
from service.quota import periods
from service.quota.accounts import require_metric


def usage(
    conn: Connection, plans: PlanConfig, *, account_id: str, metric: str, period: str | None = None
) -> int:
    """Units used in `period` (default: the current one). A period with no usage is 0. An unknown
    metric raises UnknownMetric, as a take of it would."""
    require_metric(plans, metric)
    current = periods.current_period()
    period = period or current
    params = {"account_id": account_id, "metric": metric, "period": period}
    if conn.execute(Q.account_get, params).fetchone() is None:
        raise UnknownAccount(f"unknown account {account_id!r}")
    if period >= current:
        row = conn.execute(Q.usage_open, params).fetchone()
        return int(row[0]) if row else 0  # type: ignore[call-overload]
    row = conn.execute(Q.usage_from_ledger, params).fetchone()
    return int(row[0]) if row else 0  # type: ignore[call-overload]

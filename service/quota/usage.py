"""Usage of a metric in a period: the counter for the open period, the ledger for closed ones."""

from __future__ import annotations

from service.db import Connection, Q
from service.errors import UnknownAccount
from service.quota import periods


def usage(conn: Connection, *, account_id: str, metric: str, period: str | None = None) -> int:
    """Units used in `period` (default: the current one). A period with no usage is 0."""
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

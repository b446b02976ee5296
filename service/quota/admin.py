"""Admin-only operations on an account: manual reset of a counter, soft delete and restore. Each is
audited, in the transaction that makes it, so `/v1/audit` is the one list of what admins did."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from service.billing.plans import PlanConfig
from service.db import Connection, Q, transaction
from service.errors import AccountDeleted, UnknownAccount, UnknownMetric
from service.quota import periods
from service.quota.accounts import ensure_quotas
from service.quota.takes import ROLLOVER_ACTOR, redrawn


def reset_counter(
    conn: Connection,
    plans: PlanConfig,
    *,
    account_id: str,
    metric: str,
    actor: str,
    period: str | None = None,
) -> int:
    """Set the counter of the open period to 0 with one reset ledger row naming `actor`;
    returns the value cleared. A deleted account raises AccountDeleted."""
    if metric not in plans.metrics:
        raise UnknownMetric(f"unknown metric {metric!r}; known: {', '.join(plans.metrics)}")
    period = period or periods.current_period()
    params = {"account_id": account_id, "metric": metric, "period": period, "actor": actor}
    acct = conn.execute(Q.account_get, params).fetchone()
    if acct is None:
        raise UnknownAccount(f"unknown account {account_id!r}")
    if acct[5]:
        raise AccountDeleted(f"account {account_id!r} was deleted")
    ensure_quotas(conn, plans, account_id=account_id, period=period)
    return redrawn(lambda: _reset_counter(conn, params))


def _reset_counter(conn: Connection, params: dict[str, str]) -> int:
    with transaction(conn):
        # A counter still in an earlier month is first opened into this one, as a take would.
        conn.execute(Q.roll_over, {**params, "actor": ROLLOVER_ACTOR})
        row = conn.execute(Q.admin_reset, params).fetchone()
        previous = int(row[1]) if row else 0  # type: ignore[call-overload]
        actor, account_id = params["actor"], params["account_id"]
        metric, period = params["metric"], params["period"]
        conn.execute(
            Q.audit,
            {
                "actor": actor,
                "action": "counter_reset",
                "account_id": account_id,
                "metric": metric,
                "old": Jsonb({"used": previous, "period": period}),
                "new": Jsonb({"used": 0, "period": period, "ledger_id": row[0] if row else None}),
            },
        )
    return previous


def soft_delete(conn: Connection, *, account_id: str, actor: str) -> bool:
    """Mark the account deleted: takes are refused (410) and resets skip it. Its ledger stays.
    True if this call deleted it; False if it was deleted already, and then nothing is written (the
    audit log records only what happened). UnknownAccount if there is no such account."""
    params = {"account_id": account_id}
    with transaction(conn):
        if conn.execute(Q.soft_delete_account, params).fetchone() is None:
            if conn.execute(Q.account_get, params).fetchone() is None:
                raise UnknownAccount(f"unknown account {account_id!r}")
            return False
        conn.execute(Q.soft_delete_quotas, params)
        conn.execute(
            Q.audit,
            {
                "actor": actor,
                "action": "account_deleted",
                "account_id": account_id,
                "metric": None,
                "old": Jsonb({"deleted": False}),
                "new": Jsonb({"deleted": True}),
            },
        )
    return True


def restore(conn: Connection, *, account_id: str, actor: str) -> bool:
    """Undo a soft delete: takes are accepted again and resets include the account (a counter left
    in an earlier month is rolled over by its next take). False, and no audit row, when the account
    was not deleted: the audit log records only what changed."""
    params = {"account_id": account_id}
    with transaction(conn):
        if conn.execute(Q.restore_account, params).fetchone() is None:
            if conn.execute(Q.account_get, params).fetchone() is None:
                raise UnknownAccount(f"unknown account {account_id!r}")
            return False
        conn.execute(Q.restore_quotas, params)
        conn.execute(
            Q.audit,
            {
                "actor": actor,
                "action": "account_restored",
                "account_id": account_id,
                "metric": None,
                "old": Jsonb({"deleted": True}),
                "new": Jsonb({"deleted": False}),
            },
        )
    return True

"""Admin-only operations on an account: manual reset of a counter, soft delete and restore. Each is
audited by the database function that makes it, in the same call, so `/v1/audit` is the one list of
what admins did."""

from __future__ import annotations

from psycopg.rows import dict_row

from service.db import Connection, Q, transaction
from service.errors import AccountDeleted, NotResettable
from service.plans import PlanConfig
from service.quota.accounts import ensure_quotas, find_account, require_metric
from service.quota.takes import roll_over


def reset_counter(
    conn: Connection,
    plans: PlanConfig,
    *,
    account_id: str,
    metric: str,
    actor: str,
    period: str | None = None,
) -> int:
    """Set the counter of the open period (its metric's month or day) to 0 with one reset ledger
    row naming `actor`; returns the value cleared. A deleted account raises AccountDeleted, an
    allocation NotResettable (its units are held until released)."""
    require_metric(plans, metric)
    if find_account(conn, account_id=account_id).deleted:
        raise AccountDeleted(f"account {account_id!r} was deleted")
    if plans.metric(metric).reset is None:
        raise NotResettable(f"{metric} is an allocation: its units are given back by releases, not reset")
    period = period or plans.period(metric)
    params = {"account_id": account_id, "metric": metric, "period": period, "actor": actor}
    ensure_quotas(conn, plans, account_id=account_id, period=period)
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        # A counter still in an earlier month is first opened into this one, as a take would.
        roll_over(conn, account_id=account_id, metric=metric, period=period)
        row = cur.execute(Q.admin_reset, params).fetchone()  # none: the counter held nothing
        # ledger_admin_reset writes the audit row too (`counter_reset`), as the same user.
        previous = int(row["previous"]) if row else 0
    return previous


def soft_delete(conn: Connection, *, account_id: str, actor: str) -> bool:
    """Mark the account deleted: takes are refused (410) and resets skip it. Its ledger stays.
    True if this call deleted it; False if it was deleted already, and then nothing is written (the
    audit log records only what happened). UnknownAccount if there is no such account."""
    return _set_deleted(conn, account_id=account_id, actor=actor, deleted=True)


def restore(conn: Connection, *, account_id: str, actor: str) -> bool:
    """Undo a soft delete: takes are accepted again and resets include the account (a counter left
    in an earlier month is rolled over by its next take). False, and no audit row, when the account
    was not deleted: the audit log records only what changed."""
    return _set_deleted(conn, account_id=account_id, actor=actor, deleted=False)


def _set_deleted(conn: Connection, *, account_id: str, actor: str, deleted: bool) -> bool:
    """The account's flag, its counters' copy and the audit row, in one call (account_set_deleted);
    nothing at all when the account already is as asked."""
    params = {"account_id": account_id, "deleted": deleted, "actor": actor}
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.account_set_deleted, params).fetchone()
    if row is not None and row["changed"]:
        return True
    find_account(conn, account_id=account_id)  # UnknownAccount, or it is as asked already
    return False

"""Sticky admin overrides: the only writer of the override columns. Each change is audited; a call
that changes nothing (clearing an override that is not set, setting the value it has) writes nothing."""

from __future__ import annotations

from psycopg.rows import dict_row

from service import audit
from service.db import Connection, Q, transaction
from service.errors import UnknownAccount
from service.plans import PlanConfig
from service.quota.accounts import ensure_quotas, require_metric


def _override(row: dict[str, object]) -> dict[str, object] | None:
    return {"limit": row["override_limit"]} if row["override_set"] else None


def _change(
    conn: Connection,
    plans: PlanConfig,
    *,
    account_id: str,
    metric: str,
    actor: str,
    action: str,
    override_set: bool,
    override_limit: int | None,
) -> dict[str, object] | None:
    require_metric(plans, metric)
    params = {"account_id": account_id, "metric": metric}
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.quota_for_update, params).fetchone()
        if row is None:
            ensure_quotas(conn, plans, account_id=account_id)  # raises UnknownAccount if it is
            row = cur.execute(Q.quota_for_update, params).fetchone()
            if row is None:
                raise UnknownAccount(f"unknown account {account_id!r}")
        previous = _override(row)
        new = {"limit": override_limit} if override_set else None
        if new == previous:
            return previous  # nothing changes, so there is nothing to audit
        cur.execute(
            Q.set_override, {**params, "override_set": override_set, "override_limit": override_limit}
        )
        audit.record(
            conn, actor=actor, action=action, account_id=account_id, metric=metric, old=previous, new=new
        )
    return previous


def set_override(
    conn: Connection, plans: PlanConfig, *, account_id: str, metric: str, limit: int | None, actor: str
) -> dict[str, object] | None:
    """Set a sticky override (None = unlimited); returns the previous override or None."""
    return _change(
        conn,
        plans,
        account_id=account_id,
        metric=metric,
        actor=actor,
        action="override_set",
        override_set=True,
        override_limit=limit,
    )


def clear_override(
    conn: Connection, plans: PlanConfig, *, account_id: str, metric: str, actor: str
) -> dict[str, object] | None:
    """Remove the override so the plan rules apply again; returns the previous override or None."""
    return _change(
        conn,
        plans,
        account_id=account_id,
        metric=metric,
        actor=actor,
        action="override_cleared",
        override_set=False,
        override_limit=None,
    )

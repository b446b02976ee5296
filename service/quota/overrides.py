"""Sticky admin overrides: the only writer of the override columns. Each change is audited, by the
call that makes it; a call that changes nothing (clearing an override that is not set, setting the
value it has) writes nothing."""

from __future__ import annotations

from psycopg.rows import dict_row

from service.db import Connection, Q
from service.errors import UnknownAccount
from service.plans import PlanConfig
from service.quota.accounts import ensure_quotas, require_metric


def _change(
    conn: Connection,
    plans: PlanConfig,
    change: tuple[bool, int | None],
    *,
    account_id: str,
    metric: str,
    actor: str,
) -> dict[str, object] | None:
    """`change` is (override_set, override_limit): what the counter's override becomes."""
    override_set, override_limit = change
    require_metric(plans, metric)
    params = {
        "account_id": account_id,
        "metric": metric,
        "override_set": override_set,
        "override_limit": override_limit,
        "actor": actor,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        # One call changes the override and writes its audit row (quota_set_override).
        row = cur.execute(Q.override_change, params).fetchone()
        if row is None:  # no counter yet: created first, in a statement of its own
            ensure_quotas(conn, plans, account_id=account_id)  # raises UnknownAccount if it is
            row = cur.execute(Q.override_change, params).fetchone()
            if row is None:
                raise UnknownAccount(f"unknown account {account_id!r}")
    return {"limit": row["override_limit"]} if row["override_set"] else None


def set_override(
    conn: Connection, plans: PlanConfig, *, account_id: str, metric: str, limit: int | None, actor: str
) -> dict[str, object] | None:
    """Set a sticky override (None = unlimited); returns the previous override or None."""
    return _change(conn, plans, (True, limit), account_id=account_id, metric=metric, actor=actor)


def clear_override(
    conn: Connection, plans: PlanConfig, *, account_id: str, metric: str, actor: str
) -> dict[str, object] | None:
    """Remove the override so the plan rules apply again; returns the previous override or None."""
    return _change(conn, plans, (False, None), account_id=account_id, metric=metric, actor=actor)

"""Threshold alerts: the plan file's `thresholds` copied into the database, where a take that
reaches its counter's alert line reads them (quota_alert, migrations/repeatable/events_out.sql) and
writes `quota.threshold_crossed` events in its own transaction (docs/events.md).

The copy is made by the plan sync (the daily task and `quota-ledger sync-plans`) and when the relay
starts, so a change to the thresholds reaches takes as a change to the limits does."""

from __future__ import annotations

from service.db import Connection, Q
from service.plans import PlanConfig, array_literal


def sync_thresholds(conn: Connection, plans: PlanConfig) -> None:
    """Make plan_thresholds say what `plans` says, in one transaction."""
    names = list(plans.plans)
    params = {
        "plans": array_literal(names),
        "thresholds": array_literal(array_literal(p.thresholds) for p in plans.plans.values()),
    }
    with conn.transaction():
        conn.execute(Q.thresholds_set, params)
        conn.execute(Q.thresholds_drop, params)

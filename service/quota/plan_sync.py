"""Plan sync: bring every account's stored plan limits in line with the plan config.

The set-based, batched form of what a billing tier change does to limits (quota_set_limits_for_plan,
migrations/repeatable/quota_limits.sql), with the same guarantees:
only rows whose stored plan limit, free limit or lapsed flag differ are written, each change gets
an audit row with old and new values, and the override columns are never written (overrides are
the admin API's).
Running it twice changes nothing the second time. A counter row an account lacks (a metric added
to the config) is created. Soft-deleted accounts are skipped. Usage and the ledger are not touched.

The dry run reads the same diff and writes nothing (its transactions are READ ONLY).

Batches of one shard: each batch of accounts is read without locks and grouped by the shard that
holds them (`plan_sync_pick`, `account_shard` in migrations/0014), and each group is synced in its
own transaction whose statements name its accounts, so that on Citus it locks rows on one shard
only. On one PostgreSQL a batch is one group, as before.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row, dict_row

from service.db import Connection, Q, transaction, try_advisory_xact_lock
from service.plans import Limit, PlanConfig
from service.quota import alerts, periods
from service.quota.kinds import refuse_conflicts

log = logging.getLogger(__name__)

ACTOR = "system:plan_sync"
# Fixed 64-bit advisory lock key of the plan sync (hex-packed ASCII 'qlplsync'); see
# service.quota.reset.RESET_LOCK_KEY for the registry.
PLAN_SYNC_LOCK_KEY = 0x716C_706C_7379_6E63
DEFAULT_BATCH_SIZE = 1000
_RETRIES = 5
_RETRIED = (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable)


def _show(limit: Limit) -> str:
    return "unlimited" if limit is None else str(limit)


@dataclass(frozen=True, kw_only=True)
class LimitChange:
    """One counter whose stored limits a sync changes (or creates, `created`)."""

    account_id: str
    metric: str
    created: bool
    old_plan_limit: int | None
    new_plan_limit: int | None
    old_free_limit: int | None
    new_free_limit: int | None
    old_lapsed: bool | None
    new_lapsed: bool
    override_set: bool
    override_limit: int | None

    def describe(self) -> str:
        """One line: account, metric, old -> new, and the override left alone if there is one."""
        if self.created:
            return (
                f"{self.account_id} {self.metric}: new counter, plan_limit {_show(self.new_plan_limit)}, "
                f"free_limit {_show(self.new_free_limit)}, lapsed {str(self.new_lapsed).lower()}"
            )
        parts = []
        if self.old_plan_limit != self.new_plan_limit:
            parts.append(f"plan_limit {_show(self.old_plan_limit)} -> {_show(self.new_plan_limit)}")
        if self.old_free_limit != self.new_free_limit:
            parts.append(f"free_limit {_show(self.old_free_limit)} -> {_show(self.new_free_limit)}")
        if self.old_lapsed != self.new_lapsed:
            parts.append(f"lapsed {str(self.old_lapsed).lower()} -> {str(self.new_lapsed).lower()}")
        line = f"{self.account_id} {self.metric}: {', '.join(parts)}"
        if self.override_set:
            line += f" (override {_show(self.override_limit)} left alone, still in effect)"
        return line


@dataclass(frozen=True, kw_only=True)
class SyncOutcome:
    """status: 'done' or 'lock_busy' (another sync holds the lock; skipped)."""

    status: str
    dry_run: bool
    accounts: int = 0
    changes: int = 0
    created: int = 0
    overrides_left_alone: int = 0
    duration_s: float = 0.0

    @property
    def message(self) -> str:
        if self.status == "lock_busy":
            return "plan sync: skipped: lock busy, another plan sync is running"
        verb = "would change" if self.dry_run else "changed"
        made = "would create" if self.dry_run else "created"
        return (
            f"plan sync{' (dry run, nothing written)' if self.dry_run else ''}: {self.accounts} accounts "
            f"checked, {verb} {self.changes} limits, {made} {self.created} counters, "
            f"{self.overrides_left_alone} overrides left alone, {self.duration_s:.1f} s"
        )


def _targets(plans: PlanConfig, accounts: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Per (account, metric): what the config says the stored limits and lapsed flag should be.
    The config's own rules (unknown plan -> free limits, unlisted metric -> 0) stay in PlanConfig."""
    cols: dict[str, list[Any]] = {
        "account_ids": [],
        "metrics": [],
        "plan_limits": [],
        "free_limits": [],
        "lapsed": [],
    }
    for acct in accounts:
        lapsed = acct["lapsed"]  # billing_is_lapsed, in the query that read the batch
        for metric in plans.metrics:
            cols["account_ids"].append(acct["id"])
            cols["metrics"].append(metric)
            cols["plan_limits"].append(plans.limit(acct["plan"], metric))
            cols["free_limits"].append(plans.limit(plans.free_plan, metric))
            cols["lapsed"].append(lapsed)
    return cols


def _pick(conn: Connection, *, after: str, batch_size: int) -> tuple[list[list[str]], str]:
    """The next batch of live accounts after `after`, grouped by shard, and the batch's last id."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(Q.plan_sync_pick, {"after": after, "batch_size": batch_size}).fetchall()
    return [row["group_ids"] for row in rows], (rows[-1]["end_id"] if rows else after)


def _dry_group(conn: Connection, plans: PlanConfig, *, group_ids: list[str]) -> tuple[int, list[LimitChange]]:
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SET TRANSACTION READ ONLY")
        accounts = cur.execute(
            Q.plan_sync_accounts, {"group_ids": group_ids, "free_plan": plans.free_plan}
        ).fetchall()
        if not accounts:
            return 0, []
        # The diff reads the group's counters by their accounts and joins them to the targets:
        # as reset_group (service/quota/reset.py), not by a nested loop that walks the account
        # list again for every target.
        cur.execute("SET LOCAL enable_nestloop = off")
        with conn.cursor(row_factory=class_row(LimitChange)) as diff:
            changes = diff.execute(
                Q.plan_sync_diff, {**_targets(plans, accounts), "group_ids": group_ids}
            ).fetchall()
    return len(accounts), changes


def _apply_group(
    conn: Connection, plans: PlanConfig, *, group_ids: list[str], actor: str, period: str
) -> tuple[int, list[LimitChange]] | None:
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        if not try_advisory_xact_lock(conn, PLAN_SYNC_LOCK_KEY):
            return None
        accounts = cur.execute(
            Q.plan_sync_lock_accounts, {"group_ids": group_ids, "free_plan": plans.free_plan}
        ).fetchall()
        if not accounts:
            return 0, []
        with conn.cursor(row_factory=class_row(LimitChange)) as apply:
            params = {**_targets(plans, accounts), "period": period, "actor": actor}
            changes = apply.execute(Q.plan_sync_apply, params).fetchall()
    return len(accounts), sorted(changes, key=lambda c: (c.account_id, c.metric))


def sync_plans(
    conn: Connection,
    plans: PlanConfig,
    *,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    actor: str = ACTOR,
    on_change: Callable[[LimitChange], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    period: str | None = None,
) -> SyncOutcome:
    """Sync every live account's stored limits with `plans`, in batches of `batch_size` accounts,
    each batch's group of one shard (on one PostgreSQL: the batch) its own transaction under the
    plan-sync advisory lock (busy: skip). `on_change` is called for each change (made, or with
    `dry_run` that would be made), `on_progress` with the accounts checked so far after each group
    (every 100th is logged at INFO too). Load `plans` with `load_plans` first: a broken config raises
    there and nothing is changed; a metric whose kind changed while counters hold usage counted the
    old way raises MetricKindChanged, and nothing is changed. Needs an autocommit connection. New
    counter rows open in `period` (default: the current month; a counter of another kind that holds
    nothing moves to its own period on its first take). The caller reports the changes and the
    outcome (the task logs them, the command prints them): said here too, a command run with -v
    would show each twice."""
    started = time.monotonic()
    # Counters still counted as a kind the config no longer gives their metric are converted first
    # (service/quota/kinds.py): refused here, before anything is written.
    refuse_conflicts(conn, plans)
    if not dry_run:
        alerts.sync_thresholds(conn, plans)
    period = period or periods.current_period()
    after = ""
    groups: deque[list[str]] = deque()  # the current batch's groups not yet synced
    accounts = changes = created = overrides = retries = steps = 0
    while True:
        if not groups:
            picked, after = _pick(conn, after=after, batch_size=batch_size)
            if not picked:
                break
            groups.extend(picked)
        try:
            if dry_run:
                step: tuple[int, list[LimitChange]] | None = _dry_group(conn, plans, group_ids=groups[0])
            else:
                step = _apply_group(conn, plans, group_ids=groups[0], actor=actor, period=period)
        except _RETRIED as e:
            retries += 1
            if retries > _RETRIES:
                raise
            log.warning("plan sync: batch rolled back (%s); retrying", type(e).__name__)
            continue
        if step is None:
            return SyncOutcome(status="lock_busy", dry_run=dry_run, duration_s=time.monotonic() - started)
        groups.popleft()
        n, batch_changes = step
        accounts += n
        for change in batch_changes:
            if change.created:
                created += 1
            else:
                changes += 1
                overrides += change.override_set
            if on_change is not None:
                on_change(change)
        steps += 1
        if on_progress is not None:
            on_progress(accounts)
        if steps % 100 == 0:
            log.info("plan sync: %d accounts checked so far", accounts)
    return SyncOutcome(
        status="done",
        dry_run=dry_run,
        accounts=accounts,
        changes=changes,
        created=created,
        overrides_left_alone=overrides,
        duration_s=time.monotonic() - started,
    )

"""Finance reads: ledger pages, the period export and the counter-vs-ledger reconciliation."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.rows import class_row, dict_row

from service.db import Connection, Q, transaction


@dataclass(frozen=True, kw_only=True)
class LedgerEntry:
    """One ledger row. `units` is never negative: a release carries what it gave back."""

    id: int
    at: datetime
    account_id: str
    metric: str
    period: str
    kind: str
    units: int
    used_after: int
    lim: int | None  # takes: the effective limit granted against (None: unlimited, or not a take)
    take_id: int | None
    idempotency_key: str | None
    actor: str
    prev_hash: bytes | None  # the hash chain (service/quota/chain.py)
    hash: bytes
    seq: int  # the row's position in its counter's chain: the order to check it in (not the id)
    grant_id: int | None = None  # a grant's row (README "Credits"): the grant; hashed when set


@dataclass(frozen=True, kw_only=True)
class Mismatch:
    account_id: str
    metric: str
    period: str  # the counter's: the month, one of its days, or `held`
    counter_used: int | None
    ledger_used: int
    last_used_after: int | None


@dataclass(frozen=True, kw_only=True)
class GrantMismatch:
    account_id: str
    metric: str
    grant_id: int
    remaining: int
    ledger_remaining: int


@dataclass(frozen=True, kw_only=True)
class Reconciliation:
    period: str
    checked: int
    mismatches: list[Mismatch]
    grants_checked: int = 0
    grant_mismatches: list[GrantMismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.grant_mismatches


def page(
    conn: Connection,
    *,
    after: int = 0,
    limit: int = 100,
    account_id: str | None = None,
    metric: str | None = None,
    period: str | None = None,
    kind: str | None = None,
) -> list[LedgerEntry]:
    """Rows with id > `after`, in id order, at most `limit`. On one PostgreSQL that is the order
    they were written; on Citus ids are only unique (migrations/0015), not in write order across
    nodes."""
    with conn.cursor(row_factory=class_row(LedgerEntry)) as cur:
        return cur.execute(
            Q.ledger_page,
            {
                "after": after,
                "limit": limit,
                "account_id": account_id,
                "metric": metric,
                "period": period,
                "kind": kind,
            },
        ).fetchall()


def recent(conn: Connection, *, account_id: str, limit: int = 50) -> list[LedgerEntry]:
    """An account's latest `limit` rows, newest first (by id: on Citus, near enough)."""
    with conn.cursor(row_factory=class_row(LedgerEntry)) as cur:
        return cur.execute(Q.ledger_recent, {"account_id": account_id, "limit": limit}).fetchall()


def period_rows(
    conn: Connection, *, period: str, batch: int = 5000, idle_timeout: float | None = None
) -> Generator[LedgerEntry, None, None]:
    """Every row of `period`, streamed through a server-side cursor (constant memory). With
    `idle_timeout` (seconds), PostgreSQL ends the export's transaction once it waits that long for
    its reader between two batches (idle_in_transaction_session_timeout, for this transaction only)."""
    with transaction(conn), conn.cursor(name="ledger_export", row_factory=class_row(LedgerEntry)) as cur:
        if idle_timeout is not None:
            conn.execute(Q.export_idle_timeout, {"ms": str(max(int(idle_timeout * 1000), 1))})
        cur.itersize = batch
        cur.execute(Q.ledger_period_rows, {"period": period})
        yield from cur


def reconcile(conn: Connection, *, period: str) -> Reconciliation:
    """Check every counter touched in `period` against the ledger (see the `reconciliation` query)."""
    with conn.cursor(row_factory=class_row(Mismatch)) as cur:
        rows = cur.execute(Q.reconciliation, {"period": period}).fetchall()
    bad = [
        r
        for r in rows
        if (r.counter_used is not None and r.counter_used != r.ledger_used)
        or (r.last_used_after is not None and r.last_used_after != r.ledger_used)
    ]
    with conn.cursor(row_factory=dict_row) as cur:
        grant_rows = cur.execute(Q.grant_reconciliation, {"period": period}).fetchall()
    return Reconciliation(
        period=period,
        checked=len(rows),
        mismatches=bad,
        grants_checked=len(grant_rows),
        grant_mismatches=[GrantMismatch(**r) for r in grant_rows if r["remaining"] != r["ledger_remaining"]],
    )


def audit_page(
    conn: Connection, *, after: int = 0, limit: int = 100, account_id: str | None = None
) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            Q.audit_page, {"after": after, "limit": limit, "account_id": account_id}
        ).fetchall()

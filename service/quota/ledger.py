"""Finance reads: ledger pages, the period export and the counter-vs-ledger reconciliation."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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
    take_id: int | None
    idempotency_key: str | None
    actor: str


CSV_COLUMNS = (
    "id",
    "at",
    "account_id",
    "metric",
    "period",
    "kind",
    "units",
    "used_after",
    "take_id",
    "idempotency_key",
    "actor",
)
# OWASP's CSV-injection rule: a spreadsheet runs a cell that starts like a formula. The full-width
# forms are there because some spreadsheets fold them to ASCII before parsing; the quote itself, so
# that every cell starting with a quote is one we prefixed and the raw value is that cell less one.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20", "'")


def spreadsheet_safe(value: object) -> object:
    """A CSV cell that no spreadsheet reads as a formula: a string starting with one of
    FORMULA_STARTS gets a leading single quote; anything else is kept. Quotes, commas and line
    breaks inside a cell are the csv module's to escape."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_chunks(entries: Iterable[LedgerEntry], *, rows_per_chunk: int = 1000) -> Iterator[str]:
    """`entries` as CSV text (a header line, then one line per entry, every cell through
    spreadsheet_safe), in chunks of `rows_per_chunk` rows so that an export streams."""
    buf = io.StringIO()
    out = csv.writer(buf)
    out.writerow(CSV_COLUMNS)
    for i, e in enumerate(entries, 1):
        out.writerow(spreadsheet_safe(_csv_value(getattr(e, c))) for c in CSV_COLUMNS)
        if i % rows_per_chunk == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def _csv_value(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value


@dataclass(frozen=True, kw_only=True)
class Mismatch:
    account_id: str
    metric: str
    counter_used: int | None
    ledger_used: int
    last_used_after: int | None


@dataclass(frozen=True, kw_only=True)
class Reconciliation:
    period: str
    checked: int
    mismatches: list[Mismatch]


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
    """Rows with id > `after`, oldest first, at most `limit`."""
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


def period_rows(conn: Connection, *, period: str, batch: int = 5000) -> Iterator[LedgerEntry]:
    """Every row of `period`, streamed through a server-side cursor (constant memory)."""
    with transaction(conn), conn.cursor(name="ledger_export", row_factory=class_row(LedgerEntry)) as cur:
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
    return Reconciliation(period=period, checked=len(rows), mismatches=bad)


def audit_page(
    conn: Connection, *, after: int = 0, limit: int = 100, account_id: str | None = None
) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            Q.audit_page, {"after": after, "limit": limit, "account_id": account_id}
        ).fetchall()

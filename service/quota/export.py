"""The ledger export's one row format, shared by `GET /v1/ledger.csv`, the JSON ledger pages and
`quota-ledger ledger export`: the column list and how each value is written live only here, so a
rule about cells (e.g. what a spreadsheet must not read as a formula) applies to every export."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

from service.quota.ledger import LedgerEntry

COLUMNS = (
    "id",
    "at",
    "account_id",
    "metric",
    "period",
    "kind",
    "units",
    "used_after",
    "limit",
    "take_id",
    "idempotency_key",
    "actor",
    "prev_hash",
    "hash",
)
ROWS_PER_CHUNK = 1000


def record(e: LedgerEntry) -> dict[str, Any]:
    """A ledger row as JSON-ready values: `at` in ISO 8601, the hashes in lowercase hex."""
    return {
        "id": e.id,
        "at": e.at.isoformat(),
        "account_id": e.account_id,
        "metric": e.metric,
        "period": e.period,
        "kind": e.kind,
        "units": e.units,
        "used_after": e.used_after,
        "limit": e.lim,
        "take_id": e.take_id,
        "idempotency_key": e.idempotency_key,
        "actor": e.actor,
        "prev_hash": None if e.prev_hash is None else e.prev_hash.hex(),
        "hash": e.hash.hex(),
    }


def csv_cells(e: LedgerEntry) -> list[Any]:
    """One CSV row's cells, in COLUMNS order (None is written as an empty cell)."""
    rec = record(e)
    return [rec[c] for c in COLUMNS]


def csv_chunks(entries: Iterable[LedgerEntry]) -> Iterator[str]:
    """The CSV document (header first), in chunks of ROWS_PER_CHUNK rows: constant memory."""
    buf = io.StringIO()
    out = csv.writer(buf)
    out.writerow(COLUMNS)
    for i, e in enumerate(entries, 1):
        out.writerow(csv_cells(e))
        if i % ROWS_PER_CHUNK == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def jsonl_chunks(entries: Iterable[LedgerEntry]) -> Iterator[str]:
    """One JSON object per line, the same keys as the CSV columns."""
    lines: list[str] = []
    for e in entries:
        lines.append(json.dumps(record(e), ensure_ascii=False) + "\n")
        if len(lines) == ROWS_PER_CHUNK:
            yield "".join(lines)
            lines.clear()
    yield "".join(lines)

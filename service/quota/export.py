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
    "seq",
    "grant_id",
)
ROWS_PER_CHUNK = 1000
# OWASP's CSV-injection rule: a spreadsheet runs a cell that starts like a formula. The full-width
# forms are there because some spreadsheets fold them to ASCII before parsing; the quote itself, so
# that every cell starting with a quote is one we prefixed and the raw value is that cell less one
# (which is what finance strips before re-computing a row's hash from the CSV).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20", "'")


def spreadsheet_safe(value: object) -> object:
    """A CSV cell that no spreadsheet reads as a formula: a string starting with one of
    FORMULA_STARTS gets a leading single quote; anything else is kept. Quotes, commas and line
    breaks inside a cell are the csv module's to escape."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


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
        "seq": e.seq,
        "grant_id": e.grant_id,
    }


def csv_cells(e: LedgerEntry) -> list[Any]:
    """One CSV row's cells, in COLUMNS order, each spreadsheet_safe (None is written as an empty
    cell). JSONL needs no such rule: no spreadsheet opens it."""
    rec = record(e)
    return [spreadsheet_safe(rec[c]) for c in COLUMNS]


def csv_chunks(entries: Iterable[LedgerEntry], *, rows_per_chunk: int = ROWS_PER_CHUNK) -> Iterator[str]:
    """The CSV document (header first), in chunks of `rows_per_chunk` rows: constant memory."""
    buf = io.StringIO()
    out = csv.writer(buf)
    out.writerow(COLUMNS)
    for i, e in enumerate(entries, 1):
        out.writerow(csv_cells(e))
        if i % rows_per_chunk == 0:
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

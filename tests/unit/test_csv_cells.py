"""The CSV export's cells: nothing a spreadsheet would run as a formula (OWASP CSV injection)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest

from service.quota.export import COLUMNS, csv_chunks, spreadsheet_safe
from service.quota.ledger import LedgerEntry


@pytest.mark.parametrize(
    "cell",
    ["=1+1", "+1", "-1", "@SUM(1,2)", "\t=1", "\r=1", "\uff1d1", "\uff0b1", "\uff0d1", "\uff20x", "'x"],
)
def test_a_cell_starting_like_a_formula_gets_a_leading_quote(cell):
    assert spreadsheet_safe(cell) == "'" + cell


@pytest.mark.parametrize("value", ["plain", "a=b", " =1", "", 5, 0, None, "1-2"])
def test_other_values_are_kept(value):
    assert spreadsheet_safe(value) == value


def _entry(i: int, key: str | None) -> LedgerEntry:
    return LedgerEntry(
        id=i,
        at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        account_id="-acc",
        metric="urls",
        period="2026-01",
        kind="take",
        units=1,
        used_after=i,
        lim=10,
        take_id=None,
        idempotency_key=key,
        actor="@key",
        prev_hash=None,
        hash=bytes(32),
        seq=i,
    )


def test_csv_chunks_streams_rows_with_safe_cells():
    entries = [_entry(i, f'=HYPERLINK("x",{i})') for i in range(1, 6)]
    chunks = list(csv_chunks(entries, rows_per_chunk=2))
    assert len(chunks) == 3
    rows = list(csv.reader(io.StringIO("".join(chunks), newline="")))
    assert tuple(rows[0]) == COLUMNS
    assert rows[1] == [
        "1",
        "2026-01-02T03:04:05+00:00",
        "'-acc",
        "urls",
        "2026-01",
        "take",
        "1",
        "1",
        "10",
        "",
        '\'=HYPERLINK("x",1)',
        "'@key",
        "",
        "0" * 64,
        "1",
        "",  # grant_id: none, not a grant's row
    ]
    assert len(rows) == 6

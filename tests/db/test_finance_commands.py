"""Finance's commands, run as a finance user would: `quota-ledger ledger verify`, `reconcile` and
`ledger export` (exit 0 clean, 1 on a finding, 2 on bad usage), and migration 0009 chaining the rows
written before it."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from yoyo import get_backend, read_migrations

from service.migrate import MIGRATIONS_DIR, migrate, yoyo_url
from service.quota import chain, periods, takes
from tests.db.helpers import new_account
from tests.db.test_chain import tamper

PERIOD = periods.current_period()


def cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": db_url}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def _workload(conn: Any, plans: Any) -> list[str]:
    accounts = [new_account(conn, plans) for _ in range(3)]
    for a in accounts:
        t = takes.take(
            conn, plans, account_id=a, metric="urls", units=2, idempotency_key=f"k,={a}", actor="t"
        )
        takes.take(conn, plans, account_id=a, metric="api_calls", actor="t")
        takes.release(conn, take_id=t.take_id, actor="t")
    return accounts


def test_verify_command(conn: Any, db_url: str, plans: Any) -> None:
    accounts = _workload(conn, plans)
    clean = cli(db_url, "ledger", "verify")
    assert clean.returncode == 0, clean.stderr
    assert "ledger verify: 9 rows checked in 6 counters of 3 accounts" in clean.stdout
    assert clean.stdout.rstrip().endswith(": OK")

    row_id = conn.execute(
        "SELECT id FROM ledger WHERE account_id = %s AND kind = 'release'", (accounts[1],)
    ).fetchone()[0]
    tamper(conn, "UPDATE ledger SET actor = 'someone else' WHERE id = %s", row_id)
    broken = cli(db_url, "ledger", "verify")
    assert broken.returncode == 1
    assert f"account {accounts[1]} urls row {row_id}: fields do not match the row's hash" in broken.stdout
    assert "1 break(s) in 1 account(s)" in broken.stdout
    assert cli(db_url, "ledger", "verify", "--account", accounts[0]).returncode == 0
    assert cli(db_url, "ledger", "verify", "--since", str(row_id + 1)).returncode == 0
    assert cli(db_url, "ledger", "verify", "--since", "x").returncode == 2


def test_reconcile_command(conn: Any, db_url: str, plans: Any) -> None:
    accounts = _workload(conn, plans)
    clean = cli(db_url, "reconcile", "--period", PERIOD)
    assert clean.returncode == 0, clean.stderr
    assert (
        clean.stdout.strip() == f"reconcile {PERIOD}: {len(accounts) * 3} counters and 0 grants checked: OK"
    )

    conn.execute(
        "UPDATE quotas SET used = used + 1 WHERE account_id = %s AND metric = 'urls'", (accounts[2],)
    )
    found = cli(db_url, "reconcile", "--period", PERIOD)
    assert found.returncode == 1
    assert f"{accounts[2]} urls: counter used 1, ledger sum 0, last used_after 0" in found.stdout
    assert "1 mismatch(es)" in found.stdout
    assert cli(db_url, "reconcile", "--period", "2026-13").returncode == 2
    assert cli(db_url, "reconcile").returncode == 2


def _period_rows(conn: Any) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT * FROM ledger WHERE period = %s ORDER BY account_id, metric, seq", (PERIOD,)
        ).fetchall()


def test_export_command_equals_the_periods_rows(conn: Any, db_url: str, plans: Any, tmp_path: Any) -> None:
    _workload(conn, plans)
    conn.execute(
        "INSERT INTO accounts (id, kind, plan) VALUES ('old', 'user', 'free');"
        "INSERT INTO quotas (account_id, metric, plan_limit, free_limit, period)"
        " VALUES ('old', 'urls', 5, 5, '2001-01')"
    )
    takes.take(conn, plans, account_id="old", metric="urls", actor="t", period="2001-01")
    expected = _period_rows(conn)
    assert len(expected) == 9

    out = cli(db_url, "ledger", "export", "--period", PERIOD)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [int(r["id"]) for r in rows] == [e["id"] for e in expected]
    for r, e in zip(rows, expected, strict=True):
        assert (r["account_id"], r["metric"], r["kind"], int(r["units"]), int(r["used_after"])) == (
            e["account_id"],
            e["metric"],
            e["kind"],
            e["units"],
            e["used_after"],
        )
        assert r["idempotency_key"] == (e["idempotency_key"] or "")
        assert r["take_id"] == ("" if e["take_id"] is None else str(e["take_id"]))
        assert bytes.fromhex(r["hash"]) == e["hash"]
        assert r["prev_hash"] == ("" if e["prev_hash"] is None else e["prev_hash"].hex())
    assert "ledger export" in out.stderr and "9 rows" in out.stderr
    for r in rows:  # finance's own check, from the export alone, as the README describes it
        at_us = (datetime.fromisoformat(r["at"]) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(
            microseconds=1
        )
        fields = [r["id"], at_us, *(r[c] for c in ("account_id", "metric", "period", "kind", "units"))]
        fields += [r[c] or None for c in ("used_after", "limit", "take_id", "idempotency_key", "actor")]
        message = "".join(":" if v is None else f"{len(str(v).encode())}:{v}" for v in fields)
        assert hashlib.sha256(bytes.fromhex(r["prev_hash"]) + message.encode()).hexdigest() == r["hash"]

    target = tmp_path / "ledger.jsonl"
    assert (
        cli(
            db_url, "ledger", "export", "--period", PERIOD, "--format", "jsonl", "--output", str(target)
        ).returncode
        == 0
    )
    lines = [json.loads(x) for x in target.read_text().splitlines()]
    assert list(lines[0]) == list(csv.DictReader(io.StringIO(out.stdout)).fieldnames or [])
    assert [x["hash"] for x in lines] == [e["hash"].hex() for e in expected]

    empty = cli(db_url, "ledger", "export", "--period", "1999-01")
    assert empty.returncode == 0 and empty.stdout.strip().startswith("id,at,account_id")
    assert len(empty.stdout.strip().splitlines()) == 1
    assert cli(db_url, "ledger", "export", "--period", "May").returncode == 2
    assert cli(db_url, "ledger", "export", "--period", PERIOD, "--format", "xml").returncode == 2


def test_the_migration_chains_the_rows_written_before_it(empty_db: str) -> None:
    backend = get_backend(yoyo_url(empty_db))
    try:
        every = read_migrations(str(MIGRATIONS_DIR))
        backend.apply_migrations(
            backend.to_apply(every.__class__([m for m in every if m.id < "0009"], every.post_apply))
        )
    finally:
        backend.connection.close()
    with psycopg.connect(empty_db, autocommit=True) as c:
        c.execute("INSERT INTO accounts (id, kind, plan) VALUES ('a', 'user', 'free'), ('b', 'user', 'free')")
        c.execute(
            "INSERT INTO quotas (account_id, metric, plan_limit, period, used)"
            " VALUES ('a', 'urls', 9, %s, 1), ('a', 'seats', 9, %s, 2), ('b', 'urls', 9, %s, 0)",
            (PERIOD, PERIOD, PERIOD),
        )
        c.execute(
            "INSERT INTO ledger"
            " (account_id, metric, period, kind, units, used_after, lim, idempotency_key, actor) VALUES"
            " ('a', 'urls', %(p)s, 'take', 1, 1, 9, 'k1', 'x'),"
            " ('a', 'seats', %(p)s, 'take', 2, 2, 9, NULL, 'x'),"
            " ('b', 'urls', %(p)s, 'take', 3, 3, NULL, NULL, 'x'),"
            " ('a', 'urls', %(p)s, 'take', 1, 2, 9, NULL, 'y')",
            {"p": PERIOD},
        )
        c.execute(
            "INSERT INTO ledger (account_id, metric, period, kind, units, used_after, take_id, actor)"
            " VALUES ('b', 'urls', %s, 'release', 3, 0, 3, 'x')",
            (PERIOD,),
        )

    assert migrate(empty_db)[0] == "0009.ledger_chain"

    with psycopg.connect(empty_db, autocommit=True) as c:
        result = chain.verify(c)  # type: ignore[arg-type]
        assert result.ok, result.findings
        assert (result.rows, result.counters, result.accounts) == (5, 3, 2)
        heads = c.execute(
            "SELECT account_id, metric, chain_id, chain_seq FROM quotas ORDER BY 1, 2"
        ).fetchall()
        assert heads == [("a", "seats", 2, 1), ("a", "urls", 4, 2), ("b", "urls", 5, 2)]
        # 0015 numbered each counter's rows in the order 0009 chained them (id order)
        positions = c.execute("SELECT id, seq FROM ledger ORDER BY id").fetchall()
        assert positions == [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]

"""Nothing in the service depends on session state, so that a transaction pooler (PgBouncer in
transaction mode) may run each transaction on another server connection. Prepared statements are
the one exception, switched by DB_PREPARED_STATEMENTS (tests/faults/test_pgbouncer.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What a session keeps between transactions, and how our code would ask for it.
SESSION_STATE = {
    "session advisory lock": re.compile(r"pg_(try_)?advisory_lock(_shared)?\s*\(", re.I),
    # a statement that begins with SET: a Python string, or a named query after its comments
    "SET outside a transaction": re.compile(
        r"""(["']|^-- name: \w+\n(--[^\n]*\n)*)\s*SET\s+(?!LOCAL\b|TRANSACTION\b)\w+\s*(=|TO\b)""",
        re.I | re.M,
    ),
    "session characteristics": re.compile(r"SET\s+SESSION\b", re.I),
    "temporary table": re.compile(r"CREATE\s+(GLOBAL\s+|LOCAL\s+)?TEMP(ORARY)?\s+TABLE", re.I),
    "cursor kept past its transaction": re.compile(r"WITH\s+HOLD|withhold\s*=\s*True", re.I),
    # the SQL keyword, in capitals as our SQL writes it (a comment's "listen on" is not one)
    "LISTEN": re.compile(r"\bLISTEN\s+\w"),
    "explicit prepare": re.compile(r"prepare\s*=\s*True|\bPREPARE\s+\w+\s*(\(|AS\b)", re.I),
}


def test_no_code_relies_on_session_state() -> None:
    files = [*ROOT.glob("service/**/*.py"), *ROOT.glob("service/**/*.sql"), *ROOT.glob("workers/*.py")]
    assert files
    found = [
        f"{path.relative_to(ROOT)}: {what}: {m.group(0).strip()!r}"
        for path in files
        for what, pattern in SESSION_STATE.items()
        for m in pattern.finditer(path.read_text())
    ]
    assert found == []


def test_the_patterns_catch_what_they_are_for() -> None:
    samples = {
        "session advisory lock": "SELECT pg_advisory_lock(1)",
        "SET outside a transaction": 'conn.execute("SET statement_timeout = 1000")',
        "session characteristics": "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "temporary table": "CREATE TEMP TABLE t (x int)",
        "cursor kept past its transaction": "conn.cursor(name='c', withhold=True)",
        "LISTEN": "LISTEN jobs",
        "explicit prepare": "cur.execute(q, prepare=True)",
    }
    for what, text in samples.items():
        assert SESSION_STATE[what].search(text), what
    assert not SESSION_STATE["SET outside a transaction"].search('cur.execute("SET TRANSACTION READ ONLY")')
    assert not SESSION_STATE["SET outside a transaction"].search("UPDATE quotas\n   SET used = 0")
    assert SESSION_STATE["SET outside a transaction"].search("-- name: x\n-- why\nSET search_path = a")
    assert SESSION_STATE["SET outside a transaction"].search("-- name: x\n-- why\nSET search_path = a")

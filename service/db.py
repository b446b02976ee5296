"""Connection pool, transactions, advisory locks and the named SQL queries."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg_pool import ConnectionPool

Connection = psycopg.Connection[tuple[object, ...]]

_SQL_DIR = Path(__file__).resolve().parent / "sql"
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(path: Path) -> dict[str, str]:
    """Split a .sql file into its `-- name: x` sections."""
    text = path.read_text()
    parts = _NAME.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


class Queries:
    """All named queries of service/sql/, loaded once: `Q.take`, `Q.release`, ..."""

    def __init__(self) -> None:
        self._q: dict[str, str] = {}
        for path in sorted(_SQL_DIR.glob("*.sql")):
            for name, sql in load_queries(path).items():
                if name in self._q:
                    raise RuntimeError(f"query {name!r} defined twice (in {path.name})")
                self._q[name] = sql

    def __getattr__(self, name: str) -> str:
        try:
            return self._q[name]
        except KeyError:
            raise AttributeError(name) from None


Q = Queries()


def make_pool(url: str, *, size: int = 4, name: str = "quota-ledger") -> ConnectionPool[Connection]:
    """A pool of autocommit connections: a single statement is its own transaction, and
    `transaction(conn)` opens an explicit one where several statements must commit together.
    The pool opens lazily so that it is created after a gunicorn fork, never before."""
    return ConnectionPool(
        url,
        min_size=1,
        max_size=max(size, 1),
        kwargs={"autocommit": True, "application_name": name},
        open=False,
        name=name,
    )


@contextmanager
def transaction(conn: Connection) -> Iterator[Connection]:
    """One explicit transaction on an autocommit connection; commits on exit, rolls back on error."""
    with conn.transaction():
        yield conn


def try_advisory_xact_lock(conn: Connection, key: int) -> bool:
    """Try the transaction-level advisory lock `key`. Call inside `transaction()`: on an autocommit
    connection the lock would be released as soon as the statement ends and protect nothing."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("advisory xact lock taken outside a transaction")
    row = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (key,)).fetchone()
    return bool(row and row[0])

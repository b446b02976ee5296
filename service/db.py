"""Connection pool, transactions, advisory locks and the named SQL queries.

Where a query lives: in the .sql file beside the module that runs it, named like it
(service/quota/takes.py runs service/quota/takes.sql; service/keys.py, service/keys.sql). A query
another module needs is reached through a function of its own module, not run from elsewhere.
service/sql/ holds the files not yet moved by that rule (billing.sql, jobs.sql). Every file is
loaded once into `Q`, and a query name used twice is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psycopg
from psycopg_pool import ConnectionPool

Connection = psycopg.Connection[tuple[object, ...]]
T = TypeVar("T")

_PACKAGE = Path(__file__).resolve().parent
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(path: Path) -> dict[str, str]:
    """Split a .sql file into its `-- name: x` sections."""
    text = path.read_text()
    parts = _NAME.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


class Queries:
    """All named queries of the package, loaded once: `Q.take`, `Q.release`, ..."""

    def __init__(self) -> None:
        self._q: dict[str, str] = {}
        for path in sorted(_PACKAGE.rglob("*.sql")):
            if "migrations" in path.relative_to(_PACKAGE).parts:  # shipped inside an installed package
                continue
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

_PARAM = re.compile(r"%\((\w+)\)s|%%")


@dataclass(frozen=True)
class Positional:
    """A named query rewritten once to `$1, $2, ...` placeholders, for psycopg's RawCursor.

    psycopg converts `%(name)s` to `$n` on every execute and caches the result only for queries of
    up to 4 kB; a longer statement (subscription_delivery, with its comments) would be re-parsed on
    every call, which costs more Python time than the round trip it saves. Same parameters, same
    server-side binding and prepared statement as a normal execute."""

    sql: str
    names: tuple[str, ...]

    @classmethod
    def of(cls, sql: str) -> Positional:
        names: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m.group(0) == "%%":
                return "%"
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"

        return cls(_PARAM.sub(number, sql), tuple(names))

    def execute(self, cur: psycopg.RawCursor[T], params: Mapping[str, object]) -> psycopg.RawCursor[T]:
        return cur.execute(self.sql, [params[n] for n in self.names])


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

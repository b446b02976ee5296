"""Connection pool, transactions, advisory locks and the named SQL queries.

Where a query lives: in the .sql file beside the module that runs it, named like it
(service/quota/takes.py runs service/quota/takes.sql; service/keys.py, service/keys.sql). A query
another module needs is reached through a function of its own module, not run from elsewhere.
Every file is loaded once into `Q`, and a query name used twice is refused.
"""

from __future__ import annotations

import re
import select
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import RowFactory
from psycopg_pool import ConnectionPool, PoolTimeout

from service.config import Settings

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
    up to 4 kB; a longer statement would be re-parsed on every call, which costs more Python time
    than the round trip it saves. Used for the webhook hot path's call (billing_deliver, 26
    parameters). Same parameters, same server-side binding and prepared statement as a normal
    execute."""

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


# libpq's (and psycopg's) smallest connect timeout: a database host that does not answer at all
# (rather than refusing) costs a request at most this, not the operating system's minutes.
CONNECT_TIMEOUT = 2
# How long the pool keeps retrying one lost connection before it gives up on it. psycopg_pool
# doubles the wait between attempts (1, 2, 4, 8, 16 s ...) for as long as this lasts, so the
# default five minutes meant a first success up to 17 s after a 40 s outage ended. Cut short,
# the attempts stay about a second apart, and a waiting request starts a new one at once.
RECONNECT_TIMEOUT = 1.0
# While the last request found the database unreachable, the next ones wait this long for a
# connection instead of the full pool timeout: they are answered 503 at once (and the server's
# threads stay free for /readyz) until a reconnect attempt succeeds.
FAIL_FAST_WAIT = 0.1
_WAIT_SLICE = 0.2


def connect_kwargs(settings: Settings) -> dict[str, Any]:
    """psycopg connection arguments shared by the pool, the workers and the CLI."""
    kwargs: dict[str, Any] = {
        "autocommit": True,
        # None: never prepare. A transaction pooler (PgBouncer < 1.21, or without
        # max_prepared_statements) hands each transaction to any server connection, where the
        # statements this session prepared do not exist, or another client's do.
        "prepare_threshold": 5 if settings.db_prepared_statements else None,
    }
    if "connect_timeout" not in conninfo_to_dict(settings.database_url):
        kwargs["connect_timeout"] = CONNECT_TIMEOUT
    return kwargs


def connect(settings: Settings, *, application_name: str) -> Connection:
    """One autocommit connection for a worker task or a CLI command."""
    return psycopg.connect(
        settings.database_url, application_name=application_name, **connect_kwargs(settings)
    )


def check_connection(conn: Connection) -> None:
    """The pool's check of a connection it hands out, without a round trip in the usual case: an
    idle connection has nothing to read unless the server closed it (a restart or failover sends a
    FATAL message and closes the socket). Only then does the round trip of psycopg_pool's own check
    decide: a round trip on every checkout is a measurable share of an HTTP take's CPU
    (bench/README.md, "Database outages").

    poll(), not select(): a web worker that holds many clients' connections gives its database
    connections descriptors past 1,023, which select() refuses (ValueError), and every checkout
    then failed: 1,500 idle clients on two workers made takes 503 (tests/http/test_serve.py)."""
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


class StackPool(ConnectionPool[Connection]):
    """psycopg_pool's pool, handing out the idle connection returned last instead of the one idle
    longest (its deque is a queue: popleft to hand out, append to return).

    Why: a request on the connection (and backend) that served the last one costs this process about
    65 us less CPU per take than one on the connection idle longest, the backend's cache and the
    scheduler still warm (bench/README.md, fourth session of 2026-12-07, "The pool hands out the
    connection returned last"); a queue cycles through every idle connection, so every take met a
    cold one. The connections
    left idle stay in least-recently-used order on the left, where the pool's shrinking closes the
    one idle longest, as SQLAlchemy's pool_use_lifo and Rails' pool do.

    This reaches into psycopg_pool (`_get_ready_connection`, `_pool`, called under the pool's lock):
    psycopg-pool is pinned to a minor, and tests/db/test_connections.py fails when the order is lost.
    psycopg_pool's `check()` (never called here) would reverse the idle ones' order."""

    def _get_ready_connection(self, timeout: float | None) -> Connection | None:
        # the connection returned last moves from the right end to the left, where the base class
        # takes; back again when it takes none (it raised), so that the idle ones keep their order
        self._pool.rotate(1)
        try:
            return super()._get_ready_connection(timeout)
        except BaseException:
            self._pool.rotate(-1)
            raise


class Database:
    """The process's pool of autocommit connections: a single statement is its own transaction,
    and `transaction(conn)` opens an explicit one where several statements must commit together.

    Every connection is checked as it is taken (`check_connection`), so one that died with a
    database restart is replaced instead of failing its request. While the database is unreachable,
    requests fail within `FAIL_FAST_WAIT` rather than queueing for `DB_POOL_TIMEOUT` each.
    The pool opens lazily so that it is created after the server forks a worker, never before."""

    # bench/pool_order.py compares psycopg_pool's own order
    pool_class: type[ConnectionPool[Connection]] = StackPool

    def __init__(
        self,
        settings: Settings,
        *,
        name: str = "quota-ledger",
        min_size: int = 1,
        max_size: int | None = None,
    ) -> None:
        """`max_size`: DB_POOL_SIZE unless given (the export pool gives EXPORT_POOL_SIZE)."""
        self.timeout = settings.db_pool_timeout
        self.unreachable = False
        self.timeouts = 0  # requests that got no connection in time (a metric: service/http/gauges.py)
        # When a connection last came back healthy from a request: readiness asks it when every
        # connection is out (busy serving is not down).
        self.last_returned = time.monotonic()
        self.pool: ConnectionPool[Connection] = self.pool_class(
            settings.database_url,
            min_size=min_size,
            max_size=max(settings.db_pool_size if max_size is None else max_size, 1),
            kwargs={**connect_kwargs(settings), "application_name": name},
            open=False,
            name=name,
            timeout=settings.db_pool_timeout,
            check=check_connection,
            reconnect_timeout=RECONNECT_TIMEOUT,
        )

    @contextmanager
    def connection(self, *, timeout: float | None = None) -> Iterator[Connection]:
        """A pooled connection, waiting at most `timeout` (default: DB_POOL_TIMEOUT) for one, or
        FAIL_FAST_WAIT while the database is unreachable. Raises PoolTimeout when none comes."""
        if self.pool.closed:
            self.pool.open(wait=False)
        conn = self._take(self.timeout if timeout is None else timeout)
        try:
            with conn:
                yield conn
        except psycopg.OperationalError:
            # Lock and serialization failures are OperationalErrors too; only a lost connection
            # says anything about the database.
            if conn.broken or conn.closed:
                self.unreachable = True
            raise
        finally:
            if not conn.broken:
                self.last_returned = time.monotonic()
            self.pool.putconn(conn)

    def _take(self, timeout: float) -> Connection:
        """Wait for a connection in short slices: when a connection attempt failed meanwhile (a
        pooled connection failed its check and its replacement could not connect), the database is
        down and waiting longer only holds this worker, so give up at once.

        The error count is read before the first wait, even when a connection is idle (about 2 us).
        A first try of 1 ms without it made every request that found all DB_POOL_SIZE connections
        busy, as the server's threads often do under load, wait 1 ms, raise and queue again: ~150 us
        more CPU per take with 8 requests on 4 connections (bench/README.md, "Where the web
        process's CPU goes")."""
        deadline = time.monotonic() + (min(timeout, FAIL_FAST_WAIT) if self.unreachable else timeout)
        errors = self.pool.get_stats().get("connections_errors", 0)
        while True:
            left = deadline - time.monotonic()
            try:
                conn = self.pool.getconn(timeout=max(min(left, _WAIT_SLICE), 0.001))
            except PoolTimeout:
                if left <= _WAIT_SLICE or self.pool.get_stats().get("connections_errors", 0) > errors:
                    self.unreachable = True
                    self.timeouts += 1
                    raise
                continue
            self.unreachable = False
            return conn

    def readiness(self, *, timeout: float) -> str:
        """`ok` when a connection answers `SELECT 1` within `timeout` (FAIL_FAST_WAIT while the
        database is known unreachable); `ok (busy ...)` when none was free but connections came back
        healthy meanwhile: every one is out serving requests, which is busy, not down. Otherwise
        `error: ...`. Unlike a request, a probe that times out does not mark the database unreachable."""
        started = time.monotonic()
        if self.pool.closed:
            self.pool.open(wait=False)
        try:
            conn = self.pool.getconn(timeout=min(timeout, FAIL_FAST_WAIT) if self.unreachable else timeout)
        except PoolTimeout:
            if not self.unreachable and self.last_returned > started:
                return f"ok (busy: all {self.pool.max_size} connections serving requests)"
            return "error: PoolTimeout"
        try:
            conn.execute("SELECT 1")
            return "ok"
        except Exception as e:
            return f"error: {type(e).__name__}"
        finally:
            self.pool.putconn(conn)

    def close(self) -> None:
        self.pool.close()


@contextmanager
def transaction(conn: Connection) -> Iterator[Connection]:
    """One explicit transaction on an autocommit connection; commits on exit, rolls back on error."""
    with conn.transaction():
        yield conn


def pipelined(
    conn: Connection, query: str, params: Sequence[Mapping[str, object]], *, row_factory: RowFactory[T]
) -> list[list[T] | None]:
    """Run `query` once per parameter set, each execution its own transaction as on an autocommit
    connection, all sent in one round trip: psycopg's pipeline mode, with a Sync after each
    statement. The rows of each, in order; None for one that raised, whose error is not kept (the
    others go on: an error aborts a pipeline only up to its next Sync). The caller runs such a
    statement again alone where it must know why. Raises only when the connection is lost.

    psycopg syncs a pipeline in public only by waiting for every result so far (`Pipeline.sync`),
    a round trip per statement; `_enqueue_sync` queues the Sync without waiting (psycopg 3.1 to
    3.3; tests/db/test_take_each.py holds it to one transaction per statement)."""
    cursors = []
    try:
        with conn.pipeline() as pipeline:
            for each in params:
                cur = conn.cursor(row_factory=row_factory)
                cursors.append(cur)
                try:  # sending one statement also reads the results already back: an earlier one's error
                    cur.execute(query, each)
                except psycopg.Error:
                    if conn.broken or conn.closed:
                        raise
                pipeline._enqueue_sync()
    except psycopg.Error:  # an error read as the pipeline ends
        if conn.broken or conn.closed:
            raise
    return [cur.fetchall() if cur.pgresult is not None else None for cur in cursors]


def try_advisory_xact_lock(conn: Connection, key: int) -> bool:
    """Try the transaction-level advisory lock `key`. Call inside `transaction()`: on an autocommit
    connection the lock would be released as soon as the statement ends and protect nothing."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("advisory xact lock taken outside a transaction")
    row = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (key,)).fetchone()
    return bool(row and row[0])

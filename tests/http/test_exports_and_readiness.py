"""Slow CSV readers against a real served app: exports have a pool (and a cap) of their own, so takes
and /readyz keep answering while they run; one export beyond the cap is a JSON 503, and a reader that
takes nothing for EXPORT_IDLE_TIMEOUT is cut off and gives its connection back. Readiness says
whether takes can be served: a pool busy serving them is ready."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
import pytest

from service.config import Settings
from service.db import Q
from service.keys import create_key
from service.quota import ledger, periods
from service.roles import as_login
from tests.citus import on_cluster
from tests.conftest import connect, running_app, with_database
from tests.db.helpers import new_account, set_override
from tests.http.test_serve import request, serve_env, serving

# ~6 MB of CSV: more than the socket buffers (which grow to 4 MB) of a reader that takes nothing
ROWS = 12_000
ROLES = ("product", "finance")


def seed(conn: psycopg.Connection[Any], plans: Any, rows: int) -> str:
    """`rows` ledger rows in the current period, written by the service's own take statement (in one
    pipeline), each with an idempotency key of the longest kind (255 bytes) so that fewer rows make
    a large CSV; returns the period."""
    account = new_account(conn, plans, "bulk")
    set_override(conn, account, "api_calls", None)
    period = periods.current_period()
    take = {"account_id": account, "metric": "api_calls", "units": 1, "period": period, "actor": "seed"}
    keys = (f"{i:08d}".ljust(255, "k") for i in range(rows))
    conn.cursor().executemany(Q.take, ({**take, "idempotency_key": k} for k in keys))
    written = conn.execute("SELECT count(*) FROM ledger WHERE account_id = %s", (account,)).fetchone()
    assert written == (rows,)
    return period


@pytest.fixture(scope="module")
def big_period(pg_url, template_db, app_server, app_role, plans) -> Iterator[tuple[str, str, str]]:
    """A database of this module's own whose current period has ROWS ledger rows (seeded once: it takes
    seconds): its owner URL, its URL as the service's login role, and the period."""
    if on_cluster():
        pytest.skip("the export pool is the web process's: plain PostgreSQL shows it")
    name = f"ql_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = with_database(app_server, name)
    try:
        with connect(url) as conn:
            period = seed(conn, plans, ROWS)
        yield url, as_login(url, *app_role), period
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class StalledReader:
    """A GET of the period's CSV that reads the status line and then nothing more (a tiny receive
    buffer, so that the server's sends block as soon as its own buffer is full)."""

    def __init__(self, port: int, period: str, key: str) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(
            f"GET /v1/ledger.csv?period={period} HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {key}\r\n\r\n".encode()
        )
        self.head = self.sock.recv(64)
        assert self.head.startswith(b"HTTP/1.1 200"), self.head

    def rest(self) -> bytes:
        """What the server still sends before it closes the connection (or the kernel resets it: the
        server's send timed out)."""
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := self.sock.recv(65536):
                data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def export_sessions(conn: psycopg.Connection[Any]) -> list[str]:
    """The state of each server session whose last statement was an export's (by the cursor's name:
    behind PgBouncer, the server sessions carry the pooler's application_name, not the service's)."""
    rows = conn.execute(
        "SELECT state FROM pg_stat_activity"
        " WHERE query LIKE %s AND datname = current_database() AND pid <> pg_backend_pid()",
        ("%ledger_export%",),
    ).fetchall()
    return [r[0] for r in rows]


def whole_export(port: int, conn: psycopg.Connection[Any], period: str, key: str) -> bool:
    """The period's CSV comes whole: its header, then every ledger row of the period."""
    status, body = request(port, "GET", f"/v1/ledger.csv?period={period}", key=key, timeout=30)
    rows = conn.execute("SELECT count(*) FROM ledger WHERE period = %s", (period,)).fetchone()
    return status == 200 and rows is not None and len(body.splitlines()) == rows[0] + 1


def exports_running(port: int) -> str:
    """`N of M`, as /readyz reports the exports running in the (one) worker."""
    status, body = request(port, "GET", "/readyz")
    assert status == 200, body
    return str(json.loads(body)["checks"]["exports"]).split(" running")[0]


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def served(big_period, redis_url, tmp_path) -> Iterator[Any]:
    """`served(**env)`: the app over the big period's database, and its owner connection and keys."""
    url, app_url, period = big_period

    @contextmanager
    def start(**env: str) -> Iterator[tuple[int, psycopg.Connection[Any], dict[str, str], str]]:
        with connect(url) as conn, serving(serve_env(app_url, redis_url, **env), "--workers", "1",
                                           log=tmp_path / "serve.log") as (port, _):  # fmt: skip
            keys = {
                r: create_key(conn, name=f"t-{r}-{uuid.uuid4().hex[:6]}", role=r)
                for r in ("product", "finance")
            }
            yield port, conn, keys, period

    yield start


@pytest.mark.slow
def test_stalled_exports_never_take_the_takes_connections(served):
    with served(DB_POOL_SIZE="2", EXPORT_POOL_SIZE="2") as (port, conn, keys, period), ExitStack() as stack:
        product, finance = keys["product"], keys["finance"]
        assert request(port, "PUT", "/v1/accounts/acc-1", {"kind": "user"}, product)[0] in (200, 201)
        for _ in range(2):  # as many as DB_POOL_SIZE: they used to hold every connection of takes
            stack.callback(StalledReader(port, period, finance).close)
        wait_for(lambda: export_sessions(conn).count("idle in transaction") == 2, 10, "two exports running")
        for _ in range(5):
            started = time.monotonic()
            status, body = request(port, "POST", "/v1/accounts/acc-1/takes", {"metric": "api_calls"}, product)
            assert status == 201, body
            assert exports_running(port) == "2 of 2"  # ready while the exports run
            assert time.monotonic() - started < 1.5
        # one more export: a clear JSON 503 at once (it was a 500 from inside the stream)
        started = time.monotonic()
        status, body = request(port, "GET", f"/v1/ledger.csv?period={period}", key=finance)
        assert status == 503, body
        assert json.loads(body)["error"] == "exports_busy"
        assert time.monotonic() - started < 1
        stack.close()  # the readers go, and their slots come back
        wait_for(lambda: "idle in transaction" not in export_sessions(conn), 10, "stalled exports ended")
        assert whole_export(port, conn, period, finance)


@pytest.mark.slow
def test_a_stalled_reader_is_cut_off_after_the_export_idle_timeout(served):
    with served(EXPORT_POOL_SIZE="1", EXPORT_IDLE_TIMEOUT="2") as (port, conn, keys, period):
        reader = StalledReader(port, period, keys["finance"])
        try:
            running = "idle in transaction"
            wait_for(lambda: export_sessions(conn).count(running) == 1, 10, "the export running")
            started = time.monotonic()
            # neither its transaction nor its pooled connection outlive the timeout by much
            wait_for(lambda: exports_running(port) == "0 of 1", 8, "export ended")
            assert "idle in transaction" not in export_sessions(conn)
            assert whole_export(port, conn, period, keys["finance"])  # the slot came back
            assert time.monotonic() - started < 10
            rest = reader.rest()  # the server closed the stalled reader's connection
            assert not rest.endswith(b"0\r\n\r\n")  # mid-body: an incomplete export, never a short one
        finally:
            reader.close()


def test_the_export_transaction_ends_when_idle_past_its_timeout(conn, plans):
    period = seed(conn, plans, 3)
    rows = ledger.period_rows(conn, period=period, batch=1, idle_timeout=0.3)
    next(rows)
    time.sleep(1.0)  # the reader takes nothing; PostgreSQL ends the session
    with pytest.raises(psycopg.Error):  # IdleInTransactionSessionTimeout (behind PgBouncer: its own)
        list(rows)


@pytest.fixture
def small_pool_app(settings: Settings) -> Iterator[Any]:
    from dataclasses import replace

    with running_app(replace(settings, db_pool_size=1)) as app:
        yield app


def test_readiness_is_ready_while_every_connection_serves_requests(small_pool_app):
    rt = small_pool_app.extensions["quota"]
    client = small_pool_app.test_client()
    assert client.get("/readyz").status_code == 200

    def request_a() -> None:  # holds the only connection for 0.3 s, then gives it back
        with rt.db.connection():
            time.sleep(0.3)

    def request_b() -> None:  # waits for it before the probe does, and holds it for a second
        conn = rt.db.pool.getconn(timeout=5)
        time.sleep(1)
        rt.db.pool.putconn(conn)

    threads = [threading.Thread(target=request_a), threading.Thread(target=request_b)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    try:
        # the probe finds no free connection for its 0.5 s, but one came back meanwhile: busy
        started = time.monotonic()
        r = client.get("/readyz")
        assert r.status_code == 200, r.json
        assert r.json["checks"]["database"].startswith("ok (busy"), r.json
        assert time.monotonic() - started < 1  # within a second either way
        assert not rt.db.unreachable  # and the probe's wait marked nothing for the requests
    finally:
        for t in threads:
            t.join()
    with rt.db.connection():  # the only connection, held, and nothing comes back: not ready
        r = client.get("/readyz")
        assert r.status_code == 503, r.json
        assert r.json["checks"]["database"].startswith("error"), r.json

"""Every connection the service opens (the web pool, worker tasks, CLI commands) takes the same
arguments: DB_PREPARED_STATEMENTS, a bounded connect timeout, autocommit."""

from __future__ import annotations

import os
import resource

import pytest
from psycopg_pool import PoolTimeout

from service import cli, db
from service.config import Settings
from workers import tasks


@pytest.mark.parametrize(("value", "prepared"), [("on", True), ("off", False), ("OFF", False), ("1", True)])
def test_db_prepared_statements_is_read_from_the_environment(value: str, prepared: bool) -> None:
    settings = Settings.from_env({"DATABASE_URL": "postgresql://x@h/d", "DB_PREPARED_STATEMENTS": value})
    assert settings.db_prepared_statements is prepared
    assert Settings.from_env({"DATABASE_URL": "postgresql://x@h/d"}).db_prepared_statements is True


def test_a_bad_db_prepared_statements_is_refused() -> None:
    with pytest.raises(RuntimeError, match="DB_PREPARED_STATEMENTS"):
        Settings.from_env({"DATABASE_URL": "postgresql://x@h/d", "DB_PREPARED_STATEMENTS": "maybe"})


@pytest.mark.parametrize("prepared", [True, False])
def test_every_connection_honours_the_setting(db_url: str, prepared: bool) -> None:
    settings = Settings(database_url=db_url, db_prepared_statements=prepared)
    threshold = 5 if prepared else None
    database = db.Database(settings)
    try:
        with database.connection() as conn:
            assert conn.prepare_threshold == threshold and conn.autocommit
    finally:
        database.close()
    for opened in (
        tasks._connect(settings),
        cli._connect(settings),
        db.connect(settings, application_name="t"),
    ):
        with opened as conn:
            assert conn.prepare_threshold == threshold and conn.autocommit


def test_a_connect_timeout_unless_the_url_sets_one() -> None:
    assert db.connect_kwargs(Settings(database_url="postgresql://x@h/d"))["connect_timeout"] == 2
    url = "postgresql://x@h/d?connect_timeout=10"
    assert "connect_timeout" not in db.connect_kwargs(Settings(database_url=url))


def test_the_pool_hands_out_the_connection_returned_last(db_url: str) -> None:
    """A stack, not psycopg_pool's queue (db.StackPool): the connection a request returned serves the
    next one, and the others stay idle in the order they were returned."""
    database = db.Database(Settings(database_url=db_url, db_pool_size=3), min_size=3)
    try:
        database.pool.open(wait=True)  # all three connected, none handed out yet
        with database.connection() as a, database.connection() as b, database.connection() as c:
            pids = [conn.info.backend_pid for conn in (a, b, c)]  # returned c, then b, then a
        assert len(set(pids)) == 3
        for _ in range(3):
            with database.connection() as conn:
                assert conn.info.backend_pid == pids[0]  # the last returned, every time
        with database.connection() as first, database.connection() as second:
            assert [first.info.backend_pid, second.info.backend_pid] == pids[:2]
    finally:
        database.close()


def test_a_checkout_that_times_out_keeps_the_stack_in_order(db_url: str) -> None:
    database = db.Database(Settings(database_url=db_url, db_pool_size=2), min_size=2)
    try:
        database.pool.open(wait=True)
        with database.connection() as a, database.connection() as b:
            pids = [a.info.backend_pid, b.info.backend_pid]  # returned b, then a
        with pytest.raises(PoolTimeout):
            database.pool.getconn(timeout=0)  # refused before taking any
        with database.connection() as conn:
            assert conn.info.backend_pid == pids[0]
    finally:
        database.close()


def test_a_connection_past_descriptor_1023_is_checked_out(db_url: str) -> None:
    """A web worker holding many clients' sockets gives its database connections descriptors past
    1,023, where select() refuses to look (the check used it, and every checkout then failed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = len(os.listdir("/proc/self/fd")) + 1200
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} open files, and this process may open {hard} (ulimit -Hn)")
    held: list[int] = []
    database = db.Database(Settings(database_url=db_url, db_pool_size=1))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
        while not held or held[-1] < 1024:  # every descriptor below 1,024 taken
            held.append(os.open(os.devnull, os.O_RDONLY))
        with database.connection() as conn:
            assert conn.fileno() > 1023
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with database.connection() as conn:  # checked on its way out of the pool
            assert conn.execute("SELECT 2").fetchone() == (2,)
    finally:
        database.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.conftest import connect as connect_db
from tests.conftest import with_database

THREADS = 50
Conn = psycopg.Connection[Any]


@pytest.fixture
def connect(db_url: str) -> Iterator[Callable[[int], list[psycopg.Connection[Any]]]]:
    """connect(n): n autocommit connections of their own to this test's database, closed afterwards."""
    opened: list[psycopg.Connection[Any]] = []

    def connect(n: int) -> list[psycopg.Connection[Any]]:
        with ThreadPoolExecutor(max_workers=min(n, 16)) as pool:
            new = list(pool.map(lambda _: connect_db(db_url), range(n)))
        opened.extend(new)
        return new

    yield connect
    for c in opened:
        c.close()


@pytest.fixture
def empty_db(pg_url: str) -> Iterator[str]:
    """A database of its own with nothing in it (no migrations), dropped afterwards."""
    name = f"ql_empty_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield with_database(pg_url, name)
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def as_service(app_role: tuple[str, str]) -> Callable[[Conn], AbstractContextManager[None]]:
    """as_service(conn): a block run as the service's login role (a member of quota_app, nothing
    more), the privileges the service has. Not `SET ROLE quota_app`: on Citus the coordinator opens
    the shards' connections as the current role, and the NOLOGIN group cannot log in."""

    @contextmanager
    def as_service(conn: Conn) -> Iterator[None]:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(app_role[0])))
        try:
            yield
        finally:
            conn.execute("RESET ROLE")

    return as_service

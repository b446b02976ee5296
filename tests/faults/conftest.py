"""Fault tests: servers of the test's own (tests/servers.py) that it stops and starts, never the
machine's shared ones. Each test is bounded to a few seconds of outage."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.faults.outage import prepare
from tests.servers import PrivatePostgres, PrivateRedis, Unavailable


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    """A private cluster with a database `ql`; running again after every test."""
    try:
        pg = PrivatePostgres()
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute("CREATE DATABASE ql")
        yield pg
    finally:
        pg.close()


@pytest.fixture
def private_db(private_pg: PrivatePostgres) -> Iterator[str]:
    yield private_pg.url("ql")
    if not (private_pg.data / "postmaster.pid").exists():
        private_pg.start()  # a failed test left it stopped


@pytest.fixture
def product_key(private_db: str) -> dict[str, str]:
    """Authorization header of a product key, and ACCOUNT with unlimited api_calls."""
    return prepare(private_db)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    try:
        rd = PrivateRedis()
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        yield rd
    finally:
        rd.close()

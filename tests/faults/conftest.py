"""Fault tests: servers of the test's own (tests/servers.py) that it stops and starts, never the
machine's shared ones. Each test is bounded to a few seconds of outage."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from service.billing.plans import PlanConfig
from service.keys import create_key
from service.migrate import migrate
from service.quota.accounts import upsert_account
from service.quota.overrides import set_override
from tests.servers import PrivatePostgres, PrivateRedis, Unavailable

ACCOUNT = "acc-outage"


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    """A private cluster with a migrated database `ql`; running again after every test."""
    try:
        pg = PrivatePostgres()
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute("CREATE DATABASE ql")
        migrate(pg.url("ql"))
        yield pg
    finally:
        pg.close()


@pytest.fixture
def private_db(private_pg: PrivatePostgres) -> Iterator[str]:
    yield private_pg.url("ql")
    if not (private_pg.data / "postmaster.pid").exists():
        private_pg.start()  # a failed test left it stopped


@pytest.fixture
def product_key(private_db: str, plans: PlanConfig) -> dict[str, str]:
    """Authorization header of a product key, and ACCOUNT with unlimited api_calls."""
    with psycopg.connect(private_db, autocommit=True) as conn:
        conn.execute("DELETE FROM api_keys WHERE name = 'outage'")
        key = create_key(conn, name="outage", role="product")
        upsert_account(conn, plans, account_id=ACCOUNT, kind="user")
        set_override(conn, plans, account_id=ACCOUNT, metric="api_calls", limit=None, actor="test")
    return {"Authorization": f"Bearer {key}"}


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


def serve_env(database_url: str, redis_url: str, **extra: Any) -> dict[str, str]:
    from tests.conftest import PLANS_FILE

    return {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "PLANS_FILE": str(PLANS_FILE),
        "KEY_CACHE_SECONDS": "0",  # every request needs the database, as an uncached key would
        **{k: str(v) for k, v in extra.items()},
    }

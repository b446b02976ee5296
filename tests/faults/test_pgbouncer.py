"""Behind PgBouncer in transaction mode (what most hosted Postgres puts in front): with
DB_PREPARED_STATEMENTS=off the service works; prepared statements are what break there. The rest
of the suite's takes, races, webhooks and reset tests run behind it too (QL_TEST_PGBOUNCER=1)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from service.config import Settings
from tests.conftest import PLANS_FILE, running_app, with_database
from tests.servers import PgBouncer, Unavailable

ROOT = Path(__file__).resolve().parents[2]


def bouncer(pg_url: str, **kwargs: Any) -> PgBouncer:
    try:
        return PgBouncer(pg_url, **kwargs)
    except Unavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def via_bouncer(pg_url: str, db_url: str) -> Iterator[str]:
    """This test's database, through a PgBouncer in transaction mode with 4 server connections:
    fewer than the clients, so transactions of different clients share server connections."""
    b = bouncer(pg_url, pool_size=4)
    try:
        yield with_database(b.url("postgres"), urlsplit(db_url).path.lstrip("/"))
    finally:
        b.close()


def test_the_service_behind_pgbouncer_with_prepared_statements_off(via_bouncer: str, redis_url: str) -> None:
    settings = Settings(
        database_url=via_bouncer,
        redis_url=redis_url,
        plans_file=PLANS_FILE,
        db_pool_size=8,
        db_prepared_statements=False,
        key_cache_seconds=0.0,
    )
    with running_app(settings) as app:
        with psycopg.connect(via_bouncer, autocommit=True, prepare_threshold=None) as conn:
            from service.keys import create_key

            key = {"Authorization": "Bearer " + create_key(conn, name="pgb", role="product")}
        client = app.test_client()
        accounts = [f"acc-{i}" for i in range(8)]
        for a in accounts:
            assert client.put(f"/v1/accounts/{a}", json={"kind": "user"}, headers=key).status_code == 201

        def takes(account: str) -> list[int]:
            c = app.test_client()
            # the same statements many times over on each pooled connection: past psycopg's
            # prepare threshold (5), where prepared statements would start
            return [
                c.post(f"/v1/accounts/{account}/takes", json={"metric": "api_calls"}, headers=key).status_code
                for _ in range(25)
            ]

        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = [s for batch in pool.map(takes, accounts) for s in batch]
        assert statuses == [201] * 200
        for a in accounts:
            assert client.get(f"/v1/accounts/{a}", headers=key).json["limits"]["api_calls"]["used"] == 25
        r = client.get("/readyz")
        assert r.status_code == 200, r.json


def _version() -> tuple[int, ...]:
    exe = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"PgBouncer (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def test_prepared_statements_break_behind_pgbouncer_before_1_21(pg_url: str, db_url: str) -> None:
    """The negative control, and why the setting exists: two clients sharing one server
    connection each prepare their first statement under the same name (`_pg3_0`)."""
    b = bouncer(pg_url, pool_size=1)
    try:
        url = with_database(b.url("postgres"), urlsplit(db_url).path.lstrip("/"))
        if _version() >= (1, 21):
            pytest.skip("PgBouncer >= 1.21 can keep prepared statements (max_prepared_statements)")

        def two_clients(prepare_threshold: int | None) -> list[str]:
            errors = []
            with (
                psycopg.connect(url, autocommit=True, prepare_threshold=prepare_threshold) as a,
                psycopg.connect(url, autocommit=True, prepare_threshold=prepare_threshold) as b2,
            ):
                for conn, n in ((a, 1), (b2, 2), (a, 3), (b2, 4)):
                    try:
                        conn.execute("SELECT %s::int + 0" if n % 2 else "SELECT %s::text", (n,))
                    except psycopg.Error as e:
                        errors.append(str(e).splitlines()[0])
            return errors

        assert two_clients(None) == []
        assert any("prepared statement" in e for e in two_clients(0)), "expected a prepared-statement error"
    finally:
        b.close()

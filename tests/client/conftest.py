"""The client against a real running service (served over a socket, real Postgres) and against
InMemoryQuota: `backend` runs each contract test on both.

On the service side the client goes through FlakyProxy, so that a test can refuse or lose requests
on the network; set-up that is not under test (limits, soft delete) is plain SQL, as in tests/db,
and a feature override the domain call. The service runs in this process, so `set_now` moves its
clock (service.quota.periods.now) as InMemoryService's."""

from __future__ import annotations

import asyncio
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import httpx
import psycopg
import pytest
from quota_client import AsyncQuotaClient, QuotaClient
from quota_client.testing import AsyncInMemoryQuota, InMemoryQuota, InMemoryService
from werkzeug.serving import make_server

from service.config import Settings
from service.keys import create_key
from service.plans import load_plans
from service.quota import features, grants, periods
from service.vocabulary import GrantSource
from tests.client.proxy import FlakyProxy
from tests.conftest import PLANS_FILE, running_app, with_database
from tests.db.helpers import set_override, soft_delete

PLANS = load_plans(PLANS_FILE)
FAST = {"retries": 3, "backoff": 0.001, "max_backoff": 0.01, "timeout": 10.0}


class Backend(Protocol):
    name: str

    def client(self, **options: Any) -> QuotaClient: ...
    def async_client(self, **options: Any) -> AsyncQuotaClient: ...
    def set_limit(self, account_id: str, metric: str, limit: int | None) -> None: ...
    def set_feature(self, account_id: str, feature: str, enabled: bool | None) -> None:
        """An admin's override of the feature; None clears it."""

    def delete(self, account_id: str) -> None: ...
    def grant(self, account_id: str, metric: str, units: int, expires_at: datetime | None = None) -> int:
        """An admin's grant of credits; returns its id."""

    def void_grant(self, grant_id: int) -> None: ...
    def set_now(self, at: datetime) -> None:
        """Stop the backend's clock at `at` (for the rest of the test)."""

    def fail_next(self, count: int) -> None:
        """The next `count` requests are answered 503 without reaching the quota logic."""

    def stall_next(self, count: int) -> None:
        """The next `count` requests are applied and their answers held back, until the client
        gives up (interrupted, cancelled, timed out)."""

    @property
    def stalled(self) -> int:
        """Answers held back so far."""

    @property
    def requests(self) -> int:
        """Requests that reached the front of the backend so far."""


@dataclass
class ServiceBackend:
    proxy: FlakyProxy
    key: str
    conn: psycopg.Connection[Any]
    monkeypatch: pytest.MonkeyPatch
    name: str = "service"

    def client(self, **options: Any) -> QuotaClient:
        return QuotaClient(self.proxy.url, self.key, **{**FAST, **options})

    def async_client(self, **options: Any) -> AsyncQuotaClient:
        return AsyncQuotaClient(self.proxy.url, self.key, **{**FAST, **options})

    def set_limit(self, account_id: str, metric: str, limit: int | None) -> None:
        set_override(self.conn, account_id, metric, limit)

    def set_feature(self, account_id: str, feature: str, enabled: bool | None) -> None:
        who = {"account_id": account_id, "feature": feature, "actor": "test"}
        if enabled is None:
            features.clear_override(self.conn, PLANS, **who)
        else:
            features.set_override(self.conn, PLANS, enabled=enabled, **who)

    def delete(self, account_id: str) -> None:
        soft_delete(self.conn, account_id)

    def grant(self, account_id: str, metric: str, units: int, expires_at: datetime | None = None) -> int:
        ref = uuid.uuid4().hex
        return grants.create_grant(
            self.conn, PLANS, account_id=account_id, metric=metric, units=units, expires_at=expires_at,
            source=GrantSource.ADMIN, source_ref=ref, actor="test",
        ).grant_id  # fmt: skip

    def void_grant(self, grant_id: int) -> None:
        grants.void_grant(self.conn, grant_id=grant_id, actor="test")

    def set_now(self, at: datetime) -> None:
        self.monkeypatch.setattr(periods, "now", lambda: at)  # undone after the test

    def fail_next(self, count: int) -> None:
        self.proxy.refuse_next(count)

    def stall_next(self, count: int) -> None:
        self.proxy.stall_next(count)

    @property
    def stalled(self) -> int:
        return self.proxy.dropped

    @property
    def requests(self) -> int:
        return self.proxy.requests


STALL_SECONDS = 1.0


class StallingService(InMemoryService):
    """InMemoryService that can hold an answer back after applying the call, as FlakyProxy does in
    front of the service: for a second, then a read timeout."""

    def __init__(self, limits: dict[str, int | None], **options: Any) -> None:
        super().__init__(limits, **options)
        self.stalled = 0
        self._stalls = 0
        self._stall_lock = threading.Lock()

    def stall_next(self, count: int) -> None:
        with self._stall_lock:
            self._stalls += count

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if self._stall():
            threading.Event().wait(STALL_SECONDS)  # a signal's KeyboardInterrupt ends the wait
            raise httpx.ReadTimeout("the answer was held back", request=request)
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if self._stall():
            await asyncio.sleep(STALL_SECONDS)
            raise httpx.ReadTimeout("the answer was held back", request=request)
        return response

    def _stall(self) -> bool:
        with self._stall_lock:
            if not self._stalls:
                return False
            self._stalls -= 1
            self.stalled += 1
            return True


@dataclass
class MemoryBackend:
    service: StallingService
    name: str = "memory"

    def client(self, **options: Any) -> QuotaClient:
        return InMemoryQuota(service=self.service, **_memory_options(options))

    def async_client(self, **options: Any) -> AsyncQuotaClient:
        return AsyncInMemoryQuota(service=self.service, **_memory_options(options))

    def set_limit(self, account_id: str, metric: str, limit: int | None) -> None:
        self.service.set_limit(account_id, metric, limit)

    def set_feature(self, account_id: str, feature: str, enabled: bool | None) -> None:
        if enabled is None:
            self.service.clear_feature(account_id, feature)
        else:
            self.service.set_feature(account_id, feature, enabled)

    def delete(self, account_id: str) -> None:
        self.service.delete_account(account_id)

    def grant(self, account_id: str, metric: str, units: int, expires_at: datetime | None = None) -> int:
        return self.service.grant(account_id, metric, units, expires_at=expires_at)

    def void_grant(self, grant_id: int) -> None:
        self.service.void_grant(grant_id)

    def set_now(self, at: datetime) -> None:
        self.service.now = at

    def fail_next(self, count: int) -> None:
        self.service.fail_next(count)

    def stall_next(self, count: int) -> None:
        self.service.stall_next(count)

    @property
    def stalled(self) -> int:
        return self.service.stalled

    @property
    def requests(self) -> int:
        return self.service.requests


def free_plan_service() -> StallingService:
    """InMemoryService as the free plan of tests/plans.toml, which a new account of the service is on:
    its limits and features, and the file's kinds of metric."""
    free = PLANS.plans[PLANS.free_plan]
    return StallingService(
        dict(free.limits),
        metrics={m: {"reset": k.reset} if k.reset else {"kind": k.kind} for m, k in PLANS.kinds.items()},
        features={f: f in free.features for f in PLANS.features},
    )


def _memory_options(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in ("retries", "backoff", "on_release_error")}


@contextmanager
def interrupted_when_stalled(
    backend: Backend, then: Callable[[], None] = lambda: None, *, times: int = 1
) -> Iterator[None]:
    """Ctrl-C (SIGINT to this thread) once the backend holds an answer back, after `then()`; with
    `times`, again at each of the next answers held back. Each KeyboardInterrupt arrives while the
    client waits for an answer that the service has applied."""
    main = threading.get_ident()
    done = threading.Event()

    def watch() -> None:
        sent = 0
        while sent < times and not done.wait(0.005):
            if backend.stalled > sent:
                if not sent:
                    then()
                signal.pthread_kill(main, signal.SIGINT)
                sent += 1

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


@pytest.fixture(scope="session")
def service_db(pg_url: str, template_db: str) -> Iterator[str]:
    """One migrated database for every client test: the client treats the service as a black box
    that many callers share, so each test keeps to accounts of its own (`acc`) instead of paying
    for a database clone and a server start per test."""
    name = f"ql_client_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield with_database(pg_url, name)
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def conn(service_db: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(service_db, autocommit=True) as c:
        yield c


@pytest.fixture(scope="session")
def live_service(service_db: str, redis_url: str) -> Iterator[str]:
    """The app served on a real socket by werkzeug in a thread; its base URL."""
    settings = Settings(
        database_url=service_db,
        redis_url=redis_url,
        plans_file=PLANS_FILE,
        db_pool_size=8,
        key_cache_seconds=0.0,
    )
    with running_app(settings) as app:
        server = make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}"
        finally:
            server.shutdown()
            thread.join(5)
            server.server_close()


@pytest.fixture(scope="session")
def _proxy(live_service: str) -> Iterator[FlakyProxy]:
    host, port = live_service.removeprefix("http://").split(":")
    with FlakyProxy((host, int(port))) as p:
        yield p


@pytest.fixture
def proxy(_proxy: FlakyProxy) -> FlakyProxy:
    _proxy.reset()
    return _proxy


@pytest.fixture(scope="session")
def product_key(service_db: str) -> str:
    with psycopg.connect(service_db, autocommit=True) as c:
        return create_key(c, name="client-product", role="product")


@pytest.fixture
def acc() -> str:
    """An account id of this test's own."""
    return f"acc-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["service", "memory"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        return MemoryBackend(free_plan_service())
    return ServiceBackend(
        request.getfixturevalue("proxy"),
        request.getfixturevalue("product_key"),
        request.getfixturevalue("conn"),
        request.getfixturevalue("monkeypatch"),
    )


@pytest.fixture
def quota(backend: Backend) -> Iterator[QuotaClient]:
    with backend.client() as client:
        yield client


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the async client sleeps with asyncio

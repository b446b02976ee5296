"""Redis (the Celery broker) stopped and started: the web tier stays ready, and a monthly reset cut
off by the outage is finished by the hourly catch-up, its designed bound (docs/operations.md)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from service.config import Settings
from service.plans import PlanConfig
from service.quota import reset
from tests.conftest import PLANS_FILE, running_app
from tests.servers import PrivateRedis
from tests.workers.conftest import P1, Worker, assert_reset_exactly_once, at_iso, seed, wait_for


def test_readyz_stays_ready_through_a_broker_outage(db_url: str, private_redis: PrivateRedis) -> None:
    settings = Settings(database_url=db_url, redis_url=private_redis.url(), plans_file=PLANS_FILE)
    with running_app(settings) as app:
        client = app.test_client()
        assert client.get("/readyz").json["checks"]["broker"] == "ok"
        private_redis.stop()
        t = time.monotonic()
        r = client.get("/readyz")
        assert time.monotonic() - t < 1.0
        assert r.status_code == 200 and r.json["status"] == "ready", r.json
        assert r.json["checks"]["broker"].startswith("error")
        private_redis.start()
        assert client.get("/readyz").json["checks"]["broker"] == "ok"


@pytest.fixture
def worker(db_url: str, private_redis: PrivateRedis, tmp_path: Path) -> Iterator[Worker]:
    w = Worker(db_url=db_url, redis_url=private_redis.url(), log=tmp_path / "worker.log")
    try:
        yield w.start()
    finally:
        if private_redis.proc is None or private_redis.proc.poll() is not None:
            private_redis.start()  # Worker.stop cleans its queue's keys up in Redis
        w.stop()
        if os.environ.get("SHOW_WORKER_LOGS"):
            print(w.output())


def test_reset_cut_off_by_a_broker_outage_is_finished_by_the_catch_up(
    conn: psycopg.Connection[Any], plans: PlanConfig, worker: Worker, private_redis: PrivateRedis
) -> None:
    before = seed(conn, plans, accounts=30)
    worker.send("quota.monthly_reset", at=at_iso(), batch_size=3, pause=0.3)
    wait_for("a few committed batches", lambda: (r := run_row(conn)) and r["batches"] >= 2, timeout=30)
    private_redis.stop()  # no persistence: the unacknowledged message is gone with it
    # The worker stops running acks_late tasks when it loses the broker
    # (worker_cancel_long_running_tasks_on_connection_loss): the run stays 'running'.
    wait_for("the cut-off run to stop moving", lambda: _still(conn, seconds=1.5), timeout=20)
    partial = run_row(conn)
    assert partial is not None and partial["status"] == "running", partial
    assert 0 < partial["counters_reset"] < len(before)

    private_redis.start()
    worker.send("quota.reset_catch_up", at=at_iso())  # the next hourly tick
    wait_for("the catch-up to finish the run", lambda: _done(conn), timeout=30)
    assert_reset_exactly_once(conn, before)


def run_row(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
    return reset.reset_status(conn, period=P1)


def _done(conn: psycopg.Connection[Any]) -> bool:
    row = run_row(conn)
    return bool(row and row["status"] == "done")


def _still(conn: psycopg.Connection[Any], *, seconds: float) -> bool:
    first = run_row(conn)
    time.sleep(seconds)
    return first == run_row(conn)

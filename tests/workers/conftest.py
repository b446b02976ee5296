"""Worker tests: real Postgres, real Redis, real Celery worker subprocesses.

Each test's worker gets its own queue on a Redis db reserved for these tests, so workers of
concurrent test runs never take each other's messages.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import pytest

from service.plans import PlanConfig
from service.quota import periods
from service.quota.accounts import upsert_account
from service.quota.takes import take
from tests.conftest import PLANS_FILE
from tests.db.helpers import monthly_metrics

ROOT = Path(__file__).resolve().parents[2]
WORKER_REDIS_DB = 7


def worker_redis_url(redis_url: str) -> str:
    """The same Redis server, db WORKER_REDIS_DB (redis-py URL form: `/N` or unix `?db=N`)."""
    parts = urlsplit(redis_url)
    if parts.scheme == "unix":
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "db"] + [("db", str(WORKER_REDIS_DB))]
        # built by hand: urlunsplit drops the empty netloc, and redis-py wants `unix://` exactly
        return f"unix://{parts.netloc}{parts.path}?{urlencode(query)}"
    return urlunsplit(parts._replace(path=f"/{WORKER_REDIS_DB}"))


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# The clock of these tests: counters hold usage in P0 (a month after the real one, so that takes
# can move them there), and the reset opens P1 at 03:00 UTC on its 1st.
P0 = periods.next_period(periods.current_period())
P1 = periods.next_period(P0)
AT = periods.period_start(P1) + timedelta(hours=3)


def at_iso(at: datetime = AT) -> str:
    return at.isoformat()


def seed(
    conn: psycopg.Connection[Any], plans: PlanConfig, *, accounts: int, prefix: str = "acc"
) -> dict[tuple[str, str], int]:
    """`accounts` accounts; about two counters of a monthly metric in three hold usage in P0.
    Returns {(account, metric): used} of the monthly metrics' counters, the monthly reset's."""
    used: dict[tuple[str, str], int] = {}
    for i in range(accounts):
        account_id = f"{prefix}{i:04d}"
        upsert_account(conn, plans, account_id=account_id, kind="user")
        for j, metric in enumerate(monthly_metrics(plans)):
            units = min((i + j) % 3, plans.limit(plans.free_plan, metric) or 2)  # 0, 1 or 2
            if units:
                take(conn, plans, account_id=account_id, metric=metric, units=units, actor="test", period=P0)
            used[(account_id, metric)] = units
    # Counters without usage stay in the real current period, as never-used counters do.
    return used


def counter_mismatches(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Counter = ledger: for each counter in its period P, used = sum(take) - sum(release) over its P rows
    after its latest P reset row (DESIGN.md). Returns the counters where that fails."""
    return conn.execute(
        """
        SELECT q.account_id, q.metric, q.period, q.used, coalesce(l.used, 0)
          FROM quotas q
          LEFT JOIN LATERAL (
                SELECT sum(CASE r.kind WHEN 'take' THEN r.units
                                       WHEN 'release' THEN -r.units ELSE 0 END) AS used
                  FROM ledger r
                 WHERE r.account_id = q.account_id AND r.metric = q.metric AND r.period = q.period
                   AND r.id > coalesce((SELECT max(id) FROM ledger x
                                         WHERE x.account_id = q.account_id AND x.metric = q.metric
                                           AND x.period = q.period AND x.kind = 'reset'), 0)
          ) l ON true
         WHERE q.used <> coalesce(l.used, 0)
        """
    ).fetchall()


def reset_rows(conn: psycopg.Connection[Any], period: str) -> dict[tuple[str, str], list[tuple[int, str]]]:
    """(account, metric) -> [(units, actor)] of the reset rows that opened `period`."""
    out: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for account_id, metric, units, actor in conn.execute(
        "SELECT account_id, metric, units, actor FROM ledger WHERE kind = 'reset' AND period = %s "
        "AND idempotency_key = %s ORDER BY id",
        (period, f"period-open:{period}"),
    ):
        out.setdefault((account_id, metric), []).append((units, actor))
    return out


def assert_reset_exactly_once(
    conn: psycopg.Connection[Any], before: dict[tuple[str, str], int], period: str = P1
) -> None:
    """Every counter is in `period` at 0; every one that had usage has exactly one reset row that
    cleared exactly that usage; one that had none has no row; counter = ledger."""
    rows = reset_rows(conn, period)
    state = {
        (a, m): (p, u) for a, m, p, u in conn.execute("SELECT account_id, metric, period, used FROM quotas")
    }
    for key, used in before.items():
        assert state[key] == (period, 0), key
        if used:
            assert len(rows.get(key, [])) == 1, (key, rows.get(key))
            assert rows[key][0][0] == used, key
        else:
            assert key not in rows, key
    assert counter_mismatches(conn) == []


class Worker:
    """A `quota-ledger worker` subprocess on its own queue, and a client app to send it tasks."""

    def __init__(self, *, db_url: str, redis_url: str, log: Path, concurrency: int = 1) -> None:
        from workers.app import make_app

        self.queue = f"test-{uuid.uuid4().hex[:10]}"
        self.redis_url = worker_redis_url(redis_url)
        self.log = log
        self.env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "REDIS_URL": self.redis_url,
            "WORKER_QUEUE": self.queue,
            "PLANS_FILE": str(PLANS_FILE),
        }
        self.concurrency = concurrency
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = make_app(redis_url=self.redis_url, queue=self.queue)

    def start(self) -> Worker:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "service.cli",
                    "worker",
                    "--concurrency",
                    str(self.concurrency),
                    "--hostname",
                    f"{self.queue}@%h",
                ],
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: SIGKILL reaches the pool too
            )
        wait_for("the worker to be ready", lambda: "ready." in self.output(), timeout=60)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def send(self, name: str, task_id: str | None = None, **kwargs: Any) -> str:
        task_id = task_id or uuid.uuid4().hex
        self.client.send_task(name, kwargs=kwargs, task_id=task_id, queue=self.queue)
        return task_id

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool), as a crash or OOM kill would."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.client.close()
        # leave nothing of this queue behind in the shared Redis db
        import redis

        r = redis.Redis.from_url(self.redis_url)
        keys = list(r.scan_iter(match=f"*{self.queue}*"))
        if keys:
            r.delete(*keys)
        r.close()


@pytest.fixture
def workers(app_db_url: str, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Factory of started workers on this test's database, as the service's login role; all are
    stopped at the end."""
    made: list[Worker] = []

    def start(concurrency: int = 1) -> Worker:
        w = Worker(
            db_url=app_db_url,
            redis_url=redis_url,
            log=tmp_path / f"worker{len(made)}.log",
            concurrency=concurrency,
        )
        made.append(w)
        return w.start()

    yield start
    for w in made:
        w.stop()
    for w in made:
        if os.environ.get("SHOW_WORKER_LOGS"):
            print(w.output())

"""The monthly reset: exactly once per counter and period, through Celery and Redis, under
concurrency, redelivery and SIGKILL, without zeroing usage already taken in the new period."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from service.db import transaction, try_advisory_xact_lock
from service.plans import PlanConfig
from service.quota import reset
from service.quota.takes import take
from tests.conftest import connect as connect_db
from tests.workers.conftest import (
    AT,
    P0,
    P1,
    ROOT,
    Worker,
    assert_reset_exactly_once,
    at_iso,
    counter_mismatches,
    reset_rows,
    seed,
    wait_for,
)


def run_row(conn: psycopg.Connection[Any], period: str = P1) -> dict[str, Any] | None:
    return reset.reset_status(conn, period=period)


def is_done(conn: psycopg.Connection[Any], period: str = P1) -> bool:
    row = run_row(conn, period)
    return bool(row and row["status"] == "done")


def untouched_columns(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Everything the reset must leave alone: overrides, stored limits, tiers, statuses."""
    return conn.execute(
        "SELECT q.account_id, q.metric, q.override_set, q.override_limit, q.plan_limit, q.free_limit,"
        "       q.lapsed, q.account_deleted, a.plan, a.subscription_status, a.deleted"
        "  FROM quotas q JOIN accounts a ON a.id = q.account_id ORDER BY 1, 2"
    ).fetchall()


def test_reset_task_through_redis_worker(
    conn: psycopg.Connection[Any], plans: PlanConfig, workers: Callable[..., Worker]
) -> None:
    before = seed(conn, plans, accounts=12)
    # an admin override and a paid plan must come through untouched
    conn.execute("UPDATE quotas SET override_set = true, override_limit = 7 WHERE account_id = 'acc0001'")
    conn.execute("UPDATE accounts SET plan = 'pro', subscription_status = 'active' WHERE id = 'acc0002'")
    # a soft-deleted account keeps its counter as it was and gets no reset row
    conn.execute("UPDATE accounts SET deleted = true WHERE id = 'acc0011'")
    conn.execute("UPDATE quotas SET account_deleted = true WHERE account_id = 'acc0011'")
    deleted = {k: v for k, v in before.items() if k[0] == "acc0011"}
    live = {k: v for k, v in before.items() if k[0] != "acc0011"}
    kept = untouched_columns(conn)

    worker = workers()
    worker.send("quota.monthly_reset", at=at_iso(), batch_size=5)
    wait_for("the reset run to finish", lambda: is_done(conn))

    assert_reset_exactly_once(conn, live)
    assert untouched_columns(conn) == kept
    for (account_id, metric), used in deleted.items():
        row = conn.execute(
            "SELECT period, used FROM quotas WHERE account_id = %s AND metric = %s", (account_id, metric)
        ).fetchone()
        assert row is not None and row[0] != P1 and row[1] == used
    assert not any(k[0] == "acc0011" for k in reset_rows(conn, P1))
    run = run_row(conn)
    assert run is not None and run["counters_reset"] == len(live)
    wait_for("the worker's log line", lambda: f"monthly reset {P1}: done" in worker.output(), timeout=10)
    # the other tasks run on the same worker too (each a no-op here)
    worker.send("quota.plan_sync")
    worker.send("quota.reset_catch_up", at=at_iso())
    # acc0002 was moved to pro behind the config's back: the sync brings its 4 limits in line
    wait_for("the plan sync", lambda: "plan sync: 11 accounts checked, changed 4 limits" in worker.output())
    wait_for("the tick", lambda: f"monthly reset {P1}: already done" in worker.output())


def test_concurrent_runs_and_duplicate_delivery_reset_once(
    conn: psycopg.Connection[Any], db_url: str, plans: PlanConfig, workers: Callable[..., Worker]
) -> None:
    before = seed(conn, plans, accounts=40)
    kept = untouched_columns(conn)
    worker = workers(concurrency=2)
    barrier = threading.Barrier(4)
    outcomes: list[reset.ResetOutcome] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with connect_db(db_url) as c:
                barrier.wait()
                outcomes.append(reset.reset_month(c, at=AT, batch_size=4))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    # the same message delivered twice (same task id), as a redelivery or a second beat would
    task_id = worker.send("quota.monthly_reset", at=at_iso(), batch_size=4, pause=0.01)
    worker.send("quota.monthly_reset", task_id=task_id, at=at_iso(), batch_size=4, pause=0.01)
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    finished = f"Task quota.monthly_reset[{task_id}] succeeded"
    wait_for("both deliveries to finish", lambda: worker.output().count(finished) == 2)
    wait_for("the reset run to finish", lambda: is_done(conn))

    assert {o.status for o in outcomes} <= {"done", "lock_busy", "already_done"}
    assert conn.execute("SELECT count(*) FROM job_runs").fetchone() == (1,)
    assert_reset_exactly_once(conn, before)
    assert untouched_columns(conn) == kept
    # every counter was reset by some runner, none twice: the per-invocation counts add up
    run = run_row(conn)
    assert run is not None and run["counters_reset"] == len(before)

    ledger_size = conn.execute("SELECT count(*) FROM ledger").fetchone()
    fifth = reset.reset_month(conn, at=AT)
    assert fifth.status == "already_done" and fifth.counters_reset == 0
    assert "already done" in fifth.message
    assert conn.execute("SELECT count(*) FROM ledger").fetchone() == ledger_size


def test_worker_process_killed_midway_is_redelivered_and_completes_once(
    conn: psycopg.Connection[Any], plans: PlanConfig, workers: Callable[..., Worker]
) -> None:
    """SIGKILL the pool process running the reset: acks_late + reject_on_worker_lost put the
    message back, the worker runs it again, and it resumes from the committed batches."""
    before = seed(conn, plans, accounts=30)
    worker = workers(concurrency=1)
    task_id = worker.send("quota.monthly_reset", at=at_iso(), batch_size=3, pause=0.2)
    row = wait_for("a few committed batches", lambda: (r := run_row(conn)) and r["batches"] >= 3 and r)
    killed = int(str(row["runner"]).rsplit(":", 1)[1])
    os.kill(killed, signal.SIGKILL)
    partial = run_row(conn)
    assert partial is not None and partial["status"] == "running"
    assert 0 < partial["counters_reset"] < len(before)

    # Redelivered to a new pool process, which resumes. Should the dead process's session still
    # hold the lock at that instant, the redelivery skips ("lock busy") and the next tick finishes.
    wait_for("the redelivery", lambda: is_done(conn) or "skipped: lock busy" in worker.output())
    if not is_done(conn):
        worker.send("quota.reset_catch_up", at=at_iso(), batch_size=3)
    wait_for("the reset run to finish", lambda: is_done(conn))
    log = worker.output()
    assert "WorkerLostError" in log
    assert log.count(f"Task quota.monthly_reset[{task_id}] received") == 2
    run = run_row(conn)
    assert run is not None and run["runner"] != row["runner"]
    assert_reset_exactly_once(conn, before)


def test_whole_worker_killed_then_next_run_completes_once(
    conn: psycopg.Connection[Any], plans: PlanConfig, workers: Callable[..., Worker]
) -> None:
    """SIGKILL the whole worker (main process too) after some batches: nothing runs the rest until
    the next run (here the hourly catch-up on a new worker), which completes it; no counter is reset
    twice and the batches committed before the kill are not redone."""
    before = seed(conn, plans, accounts=30)
    first = workers(concurrency=1)
    first.send("quota.monthly_reset", at=at_iso(), batch_size=3, pause=0.2)
    wait_for("a few committed batches", lambda: (r := run_row(conn)) and r["batches"] >= 3)
    first.kill()
    partial = run_row(conn)
    assert partial is not None and partial["status"] == "running"
    done_before = partial["counters_reset"]
    assert 0 < done_before < len(before)

    second = workers(concurrency=1)
    second.send("quota.reset_catch_up", at=at_iso(), batch_size=3)
    wait_for("the reset run to finish", lambda: is_done(conn))
    assert_reset_exactly_once(conn, before)
    run = run_row(conn)
    assert run is not None and run["counters_reset"] == len(before)
    assert f"monthly reset {P1}: done: {len(before) - done_before} counters reset" in wait_for(
        "the catch-up's log line", lambda: f"monthly reset {P1}: done" in second.output() and second.output()
    )


def test_catch_up_tick_runs_a_missed_reset_and_is_a_no_op_after(
    conn: psycopg.Connection[Any], plans: PlanConfig
) -> None:
    before = seed(conn, plans, accounts=10)
    assert run_row(conn) is None  # the 00:05 run never happened (worker down, beat state lost...)
    outcome = reset.catch_up(conn, at=AT)  # the 1st, 03:00 UTC
    assert outcome.status == "done" and outcome.period == P1
    assert outcome.counters_reset == len(before)
    assert_reset_exactly_once(conn, before)

    ledger_size = conn.execute("SELECT count(*) FROM ledger").fetchone()
    again = reset.catch_up(conn, at=AT.replace(hour=4))
    assert again.status == "already_done"
    assert conn.execute("SELECT count(*) FROM ledger").fetchone() == ledger_size


def test_take_in_new_period_before_the_reset_reached_it_keeps_its_units(
    conn: psycopg.Connection[Any], db_url: str, plans: PlanConfig
) -> None:
    before = seed(conn, plans, accounts=20)
    last = ("acc0018", "urls")  # near the end of the reset's order (P0 counters come last)
    assert before[last] > 0
    result: list[reset.ResetOutcome] = []

    def run() -> None:
        with connect_db(db_url) as c:
            result.append(reset.reset_month(c, at=AT, batch_size=3, pause=0.1))

    job = threading.Thread(target=run)
    job.start()
    wait_for("the reset to start", lambda: (r := run_row(conn)) and r["batches"] >= 1)
    early = take(conn, plans, account_id=last[0], metric=last[1], units=4, actor="test", period=P1)
    # a take on a counter the job already opened is an ordinary take
    first = ("acc0000", "api_calls")
    job.join(timeout=60)
    late = take(conn, plans, account_id=first[0], metric=first[1], units=1, actor="test", period=P1)

    assert result and result[0].status == "done"
    assert early.used == 4 and early.period == P1
    assert late.used == 1
    got = conn.execute(
        "SELECT period, used FROM quotas WHERE account_id = %s AND metric = %s", last
    ).fetchone()
    assert got == (P1, 4)
    # the take's lazy rollover opened the period, not the job, and only once
    assert reset_rows(conn, P1)[last] == [(before[last], "system:rollover")]
    assert counter_mismatches(conn) == []


def test_reset_month_command_says_what_it_did(app_db_url: str, conn: psycopg.Connection[Any]) -> None:
    env = {**os.environ, "DATABASE_URL": app_db_url}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service.cli", "reset-month", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    # lock busy: another runner holds the reset lock
    with transaction(conn):
        assert try_advisory_xact_lock(conn, reset.RESET_LOCK_KEY)
        busy = cli()
    assert busy.returncode == 0, busy.stderr
    assert "skipped: lock busy" in busy.stdout

    did = cli("-v")
    assert did.returncode == 0, did.stderr
    assert ": done:" in did.stdout and "counters reset" in did.stdout
    assert (did.stdout + did.stderr).count(": done:") == 1  # -v shows progress, not the outcome again

    again = cli()
    assert again.returncode == 0 and "already done" in again.stdout

    future = cli("--period", "2999-01")
    assert future.returncode == 2 and "has not started yet" in future.stderr
    bad = cli("--period", "2025-13")
    assert bad.returncode == 2 and "YYYY-MM" in bad.stderr


@pytest.mark.parametrize("kwargs", [{"period": "2025-1"}, {"batch_size": 0}])
def test_reset_refuses_bad_arguments(conn: psycopg.Connection[Any], kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        reset.reset_month(conn, **kwargs)


def test_counters_in_a_later_period_are_left_alone(conn: psycopg.Connection[Any], plans: PlanConfig) -> None:
    """Another server's clock already opened P1 for a counter: a reset of P0 does not touch it."""
    before = seed(conn, plans, accounts=3)
    take(conn, plans, account_id="acc0000", metric="urls", units=2, actor="test", period=P1)
    outcome = reset.reset_month(conn, period=P0, at=AT)
    assert outcome.status == "done"
    assert conn.execute(
        "SELECT period, used FROM quotas WHERE account_id = 'acc0000' AND metric = 'urls'"
    ).fetchone() == (P1, 2)
    assert len(before) > 0 and counter_mismatches(conn) == []

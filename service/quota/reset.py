"""The monthly and daily resets: every live counter of a monthly consumable starts the calendar month
(UTC) from zero, exactly once, and every counter of a daily one the UTC day. Allocations are never
reset. The two jobs are the same code over their own counters (a `Cadence` each): the counters whose
periods are of the job's kind, its run rows and its lock.

It is the lazy rollover of `takes.take` done eagerly, in paced batches of one shard each. Once per
(account, metric, period) holds by construction: a try-lock per batch (busy: skip), the claimed
`job_runs` row (done: a no-op; its cursor resumes a killed run), and a batch statement that only
touches counters still in an earlier period, with a unique index refusing a second reset row. Why
each piece is there, and how the pacing yields to takes: docs/design/reset.md.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from service.db import Connection, Q, transaction, try_advisory_xact_lock
from service.quota import periods

log = logging.getLogger(__name__)

JOB = "monthly_reset"
ACTOR = "system:monthly_reset"
# Fixed 64-bit advisory lock keys of the monthly reset ("quota-ledger reset", hex-packed ASCII
# 'qlresets') and the daily one ('qlresetd'). Registry of the service's advisory lock keys: these and
# service.quota.plan_sync.PLAN_SYNC_LOCK_KEY. Never derive keys from hashtext().
RESET_LOCK_KEY = 0x716C_7265_7365_7473
DAY_RESET_LOCK_KEY = 0x716C_7265_7365_7464


@dataclass(frozen=True, kw_only=True)
class Cadence:
    """One reset job: its name in job_runs and logs, its ledger actor and lock, and its periods."""

    job: str
    actor: str
    lock_key: int
    name: str  # as logs and messages say it
    command: str  # the quota-ledger command that runs it
    form: str  # as errors say a period of it
    period_of: Callable[[datetime], str]
    is_period: Callable[[str], bool]


MONTHLY = Cadence(
    job=JOB,
    actor=ACTOR,
    lock_key=RESET_LOCK_KEY,
    name="monthly reset",
    command="reset-month",
    form="YYYY-MM",
    period_of=periods.period_of,
    is_period=periods.is_period,
)
DAILY = Cadence(
    job="daily_reset",
    actor="system:daily_reset",
    lock_key=DAY_RESET_LOCK_KEY,
    name="daily reset",
    command="reset-day",
    form="YYYY-MM-DD",
    period_of=periods.day_of,
    is_period=periods.is_day,
)
# Measured (bench/reset.md): batches of 250 at duty 0.05 keep the takes' p99 during the reset within
# 1.5x of the new month without it (500 at 0.1 gave 1.79x), and still reset 1,000,000 counters in
# about 9 minutes under load.
DEFAULT_BATCH_SIZE = 250
# Share of wall time spent in batches, and the rate (counters/s) the pacing never goes below.
DEFAULT_DUTY = 0.05
DEFAULT_MIN_RATE = 1500.0
# Batches read ahead by one `reset_pick`: its cost is shared by this many batches.
PICK_BATCHES = 8
# A batch that loses a deadlock (e.g. against a plan sync locking the same rows) is retried.
_RETRIES = 5
_RETRIED = (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable)

_START = {"cursor_period": "", "cursor_account": "", "cursor_metric": ""}


@dataclass(frozen=True, kw_only=True)
class ResetOutcome:
    """What one invocation did. `status`: 'done' (this invocation finished the period),
    'already_done' (found it finished), 'lock_busy' (another runner holds the lock; skipped)."""

    status: str
    period: str
    job: str = MONTHLY.name
    counters_reset: int = 0  # by this invocation
    reset_rows: int = 0  # of which had usage (one reset ledger row each)
    batches: int = 0
    duration_s: float = 0.0
    run_counters_reset: int = 0  # the whole run for the period, across resumed invocations
    run_reset_rows: int = 0

    @property
    def message(self) -> str:
        head = f"{self.job} {self.period}:"
        if self.status == "lock_busy":
            tail = (
                f" (after {self.counters_reset} counters in {self.batches} batches)" if self.batches else ""
            )
            return f"{head} skipped: lock busy, another runner is resetting{tail}"
        if self.status == "already_done":
            return f"{head} already done ({self.run_counters_reset} counters were reset); nothing to do"
        return (
            f"{head} done: {self.counters_reset} counters reset ({self.reset_rows} had usage) "
            f"in {self.batches} batches, {self.duration_s:.1f} s; run total {self.run_counters_reset} "
            f"counters, {self.run_reset_rows} reset rows"
        )

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "message": self.message}


@dataclass(frozen=True, kw_only=True)
class _Batch:
    status: str  # 'busy', 'already_done', 'progress', 'done'
    counters: int = 0
    reset_rows: int = 0
    run_counters: int = 0
    run_reset_rows: int = 0


@dataclass(frozen=True, kw_only=True)
class _Group:
    """One batch picked by `reset_pick`: the accounts of one shard and the range of counters to
    reset (`reset_group`'s parameters), and the run's cursor to record once it is reset."""

    params: dict[str, object]
    cursor: dict[str, str]


def runner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def target_period(
    *, period: str | None = None, at: datetime | None = None, cadence: Cadence = MONTHLY
) -> str:
    """The period to reset: `period`, or the one the clock (`at`, default now, UTC) is in.
    A period after the clock's is refused: opening it early would cut the current one short."""
    current = cadence.period_of(at or periods.now())
    if period is None:
        return current
    if not cadence.is_period(period):
        raise ValueError(f"period {period!r} is not {cadence.form}")
    if period > current:
        raise ValueError(f"period {period} has not started yet (it is {current} in UTC)")
    return period


# A batch's range of counters, first and last in index order (reset_pick's columns).
_GROUP_RANGE = ("first_period", "first_account", "first_metric", "last_period", "last_account", "last_metric")


def _pick(
    cur: psycopg.Cursor[dict[str, Any]], *, period: str, batch_size: int, cursor: dict[str, str]
) -> list[_Group]:
    """The next batches after `cursor`, by shard (see the module docstring); [] when none is left.
    The run's cursor moves to the end of the pick with its last batch only."""
    rows = cur.execute(
        Q.reset_pick,
        {"period": period, "batch_size": batch_size, "pick_size": batch_size * PICK_BATCHES, **cursor},
    ).fetchall()
    if not rows:
        return []
    end = {k: rows[-1][k.replace("cursor_", "end_")] for k in _START}
    return [
        _Group(
            params={"account_ids": row["account_ids"], **{k: row[k] for k in _GROUP_RANGE}},
            cursor=end if row is rows[-1] else cursor,
        )
        for row in rows
    ]


def _batch(
    conn: Connection,
    *,
    cadence: Cadence,
    period: str,
    batch_size: int,
    actor: str,
    runner: str,
    picked: deque[_Group],
) -> _Batch:
    """One transaction: the next batch of `picked` (read ahead when it is empty), reset and
    recorded under the lock. The batch leaves `picked` only once its transaction committed."""
    key = {"job": cadence.job, "period": period}
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        if not try_advisory_xact_lock(conn, cadence.lock_key):
            return _Batch(status="busy")
        run = cur.execute(Q.job_run_claim, key).fetchone()
        assert run is not None
        if run["status"] == "done":
            return _Batch(
                status="already_done", run_counters=run["counters_reset"], run_reset_rows=run["reset_rows"]
            )
        if not picked:
            cursor = {k: run[k] for k in _START} if run["cursor_period"] is not None else _START
            picked.extend(_pick(cur, period=period, batch_size=batch_size, cursor=cursor))
        if picked:
            group = picked[0]
            # reset_group joins the batch's locked rows back to their counters, which it names by
            # their accounts (for Citus). A prepared statement's generic plan guesses 10 accounts
            # and joins by a nested loop whose every inner index scan walks the whole account
            # list again (1.6x the batch's time, measured); a hash or merge join reads the
            # batch's counters once. Nothing else in the transaction joins.
            cur.execute("SET LOCAL enable_nestloop = off")
            step = cur.execute(Q.reset_group, {**group.params, "period": period, "actor": actor}).fetchone()
            assert step is not None
            cur.execute(
                Q.job_run_progress,
                {
                    **key,
                    **group.cursor,
                    "counters": step["counters"],
                    "reset_rows": step["reset_rows"],
                    "runner": runner,
                },
            )
        else:
            pending = cur.execute(Q.reset_pending, {"period": period}).fetchone()
            if pending and pending["pending"]:
                # The cursor passed a counter that still needs its reset (created behind the
                # cursor, or changed after the pick): start over from the beginning.
                cur.execute(
                    Q.job_run_progress, {**key, "counters": 0, "reset_rows": 0, **_START, "runner": runner}
                )
                return _Batch(status="progress")
            done = cur.execute(Q.job_run_done, {**key, "runner": runner}).fetchone()
            assert done is not None
            return _Batch(
                status="done", run_counters=done["counters_reset"], run_reset_rows=done["reset_rows"]
            )
    picked.popleft()
    return _Batch(status="progress", counters=step["counters"], reset_rows=step["reset_rows"])


def reset_month(
    conn: Connection,
    *,
    period: str | None = None,
    at: datetime | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    pause: float = 0.0,
    duty: float = DEFAULT_DUTY,
    min_rate: float = DEFAULT_MIN_RATE,
    actor: str | None = None,
    cadence: Cadence = MONTHLY,
) -> ResetOutcome:
    """Reset every live counter of the cadence's kind (monthly by default) into `period` (default:
    the period of `at`, default now, in UTC), committing every `batch_size` counters, paced (see the
    module docstring) by `duty` and `min_rate` (duty 1: no pacing), plus `pause` seconds between
    batches. Safe to call any number of times, concurrently: see the module docstring. Needs an
    autocommit connection (each batch opens its own transaction). The caller reports the outcome
    (the task logs it, the command prints it); this logs only progress."""
    period = target_period(period=period, at=at, cadence=cadence)
    actor = actor or cadence.actor
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if not 0 < duty <= 1 or min_rate <= 0:
        raise ValueError("duty must be in (0, 1] and min_rate above 0")
    runner = runner_id()
    started = time.monotonic()
    counters = reset_rows = batches = retries = 0
    picked: deque[_Group] = deque()

    def outcome(status: str, step: _Batch | None = None) -> ResetOutcome:
        return ResetOutcome(
            status=status,
            period=period,
            job=cadence.name,
            counters_reset=counters,
            reset_rows=reset_rows,
            batches=batches,
            duration_s=time.monotonic() - started,
            run_counters_reset=step.run_counters if step else 0,
            run_reset_rows=step.run_reset_rows if step else 0,
        )

    log.debug("%s %s: starting (runner %s, batches of %d)", cadence.name, period, runner, batch_size)
    while True:
        began = time.monotonic()
        try:
            step = _batch(
                conn,
                cadence=cadence,
                period=period,
                batch_size=batch_size,
                actor=actor,
                runner=runner,
                picked=picked,
            )
        except _RETRIED as e:
            retries += 1
            if retries > _RETRIES:
                raise
            log.warning("%s %s: batch rolled back (%s); retrying", cadence.name, period, type(e).__name__)
            continue
        if step.status == "busy":
            return outcome("lock_busy")
        if step.status == "already_done":
            # Finished by another runner after this one had done some batches: still 'done' for it.
            return outcome("done" if batches else "already_done", step)
        if step.status == "done":
            analyze(conn)
            return outcome("done", step)
        counters += step.counters
        reset_rows += step.reset_rows
        batches += 1
        if batches % 100 == 0:
            log.info("%s %s: %d counters reset so far", cadence.name, period, counters)
        sleep = pace(time.monotonic() - began, step.counters, duty=duty, min_rate=min_rate) + pause
        if sleep > 0:
            time.sleep(sleep)


def analyze(conn: Connection) -> None:
    """Fresh planner statistics for what a bulk job just wrote (migrations/0010 says why). A
    failure only costs plan quality until autovacuum's next ANALYZE: logged, never raised."""
    try:
        conn.execute(Q.analyze_after_bulk_write)
    except psycopg.Error as e:
        log.warning("ANALYZE after the bulk write failed (autovacuum will catch up): %s", e)


def pace(took: float, counters: int, *, duty: float, min_rate: float) -> float:
    """Seconds to sleep after a batch of `counters` that took `took` seconds: long enough that
    batches fill only `duty` of the time, but never so long that the rate falls below `min_rate`."""
    yielding = took * (1 - duty) / duty
    floor = counters / min_rate - took
    return max(0.0, min(yielding, floor))


def reset_day(conn: Connection, *, day: str | None = None, **options: Any) -> ResetOutcome:
    """The daily reset: reset_month over the counters of daily consumables, into `day` (YYYY-MM-DD,
    default the UTC day of `at`, default now)."""
    return reset_month(conn, period=day, cadence=DAILY, **options)


def reset_status(conn: Connection, *, period: str, cadence: Cadence = MONTHLY) -> dict[str, object] | None:
    """The run row of `period`, or None if no run was recorded."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q.job_run_get, {"job": cadence.job, "period": period}).fetchone()


def catch_up(
    conn: Connection,
    *,
    at: datetime | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    pause: float = 0.0,
    duty: float = DEFAULT_DUTY,
    min_rate: float = DEFAULT_MIN_RATE,
    cadence: Cadence = MONTHLY,
) -> ResetOutcome:
    """The hourly tick: run the reset of the clock's current period unless its run is done.
    Covers a missed 00:05 run (worker or beat down, lost schedule file, lost queued message) and
    resumes a run that was killed midway. A no-op read once the period is done. A day missed whole
    needs no run of its own: the next day's run opens every counter still in an earlier day."""
    period = target_period(at=at, cadence=cadence)
    run = reset_status(conn, period=period, cadence=cadence)
    if run is not None and run["status"] == "done":
        return ResetOutcome(
            status="already_done",
            period=period,
            job=cadence.name,
            run_counters_reset=int(run["counters_reset"]),  # type: ignore[call-overload]
            run_reset_rows=int(run["reset_rows"]),  # type: ignore[call-overload]
        )
    return reset_month(
        conn,
        period=period,
        at=at,
        batch_size=batch_size,
        pause=pause,
        duty=duty,
        min_rate=min_rate,
        cadence=cadence,
    )

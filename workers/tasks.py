"""Thin tasks: open a connection, call the service function, return its outcome. Each is safe to
run twice (a second run is a no-op), which acks_late redelivery relies on."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from service import webhooks
from service.billing import expiry, inbox
from service.config import Settings
from service.db import Connection, connect
from service.plans import load_plans
from service.quota import checkpoint, grants, plan_sync, reset
from workers.app import app

# The outcome of each job goes to the worker's log here (the service functions only log progress).
log = logging.getLogger(__name__)


def _connect(settings: Settings) -> Connection:
    return connect(settings, application_name="quota-ledger-worker")


@app.task(name="quota.monthly_reset")
def monthly_reset(
    period: str | None = None,
    at: str | None = None,
    batch_size: int = reset.DEFAULT_BATCH_SIZE,
    pause: float = 0.0,
    duty: float = reset.DEFAULT_DUTY,
    min_rate: float = reset.DEFAULT_MIN_RATE,
) -> dict[str, object]:
    """Reset every counter into `period` (default: the UTC month of `at`, an ISO 8601 time,
    default now), once, paced (service.quota.reset)."""
    when = datetime.fromisoformat(at) if at else None
    with _connect(Settings.from_env()) as conn:
        outcome = reset.reset_month(
            conn, period=period, at=when, batch_size=batch_size, pause=pause, duty=duty, min_rate=min_rate
        )
    log.info("%s", outcome.message)
    return outcome.as_dict()


@app.task(name="quota.daily_reset")
def daily_reset(
    day: str | None = None,
    at: str | None = None,
    batch_size: int = reset.DEFAULT_BATCH_SIZE,
    duty: float = reset.DEFAULT_DUTY,
    min_rate: float = reset.DEFAULT_MIN_RATE,
) -> dict[str, object]:
    """Reset every counter of a daily metric into `day` (default: the UTC day of `at`, an ISO 8601
    time, default now), once, paced (service.quota.reset)."""
    when = datetime.fromisoformat(at) if at else None
    with _connect(Settings.from_env()) as conn:
        outcome = reset.reset_day(conn, day=day, at=when, batch_size=batch_size, duty=duty, min_rate=min_rate)
    log.info("%s", outcome.message)
    return outcome.as_dict()


@app.task(name="quota.reset_catch_up")
def reset_catch_up(
    at: str | None = None,
    batch_size: int = reset.DEFAULT_BATCH_SIZE,
    pause: float = 0.0,
    duty: float = reset.DEFAULT_DUTY,
    min_rate: float = reset.DEFAULT_MIN_RATE,
) -> dict[str, object]:
    """The hourly tick: the current month's reset if it is not done, then the current day's. `at`
    (ISO 8601) sets the clock, for tests. Returns the month's outcome, with the day's under "daily"."""
    when = datetime.fromisoformat(at) if at else None
    with _connect(Settings.from_env()) as conn:
        outcomes = [
            reset.catch_up(
                conn, at=when, batch_size=batch_size, pause=pause, duty=duty, min_rate=min_rate, cadence=c
            )
            for c in (reset.MONTHLY, reset.DAILY)
        ]
    for outcome in outcomes:
        log.info("%s", outcome.message)
    return {**outcomes[0].as_dict(), "daily": outcomes[1].as_dict()}


@app.task(name="quota.plan_sync")
def plan_sync_task() -> dict[str, object]:
    """Bring stored plan limits in line with PLANS_FILE. A broken file fails the task, changing nothing."""
    settings = Settings.from_env()
    plans = load_plans(settings.plans_file)
    with _connect(settings) as conn:
        outcome = plan_sync.sync_plans(
            conn, plans, on_change=lambda c: log.info("plan sync: %s", c.describe())
        )
    log.info("%s", outcome.message)
    return {"status": outcome.status, "message": outcome.message}


@app.task(name="billing.expire_access")
def expire_access(at: str | None = None) -> dict[str, object]:
    """End the subscriptions whose access ended by time, and let their accounts follow. `at` (ISO
    8601) sets the clock, for tests."""
    settings = Settings.from_env()
    plans = load_plans(settings.plans_file)
    when = datetime.fromisoformat(at) if at else None
    with _connect(settings) as conn:
        outcome = expiry.end_expired(conn, plans, at=when)
    return {"accounts": outcome.accounts, "subscriptions": outcome.subscriptions, "message": outcome.message}


@app.task(name="quota.expire_grants")
def expire_grants() -> dict[str, object]:
    """Write the expiry row of every grant past its time that has none yet (service.quota.grants);
    a second run writes nothing."""
    settings = Settings.from_env()
    with _connect(settings) as conn:
        written = grants.expire_due(conn)
    log.info("expire grants: %d expiry rows written", written)
    return {"expired": written}


@app.task(name="ledger.checkpoint")
def ledger_checkpoint(at: str | None = None) -> dict[str, object]:
    """The day's signed ledger checkpoint into LEDGER_CHECKPOINT_DIR, signed with
    LEDGER_CHECKPOINT_KEY (service.quota.checkpoint); skipped unless both are set, a no-op when the
    day's file exists. A ledger that does not verify is not signed: logged as an error. `at` (ISO
    8601) sets the day, for tests."""
    settings = Settings.from_env()
    directory, key_file = settings.ledger_checkpoint_dir, settings.ledger_checkpoint_key
    if directory is None or key_file is None:
        log.info("ledger checkpoint: skipped, LEDGER_CHECKPOINT_DIR and LEDGER_CHECKPOINT_KEY not both set")
        return {"status": "skipped"}
    key = checkpoint.load_private_key(key_file)
    when = datetime.fromisoformat(at) if at else None
    try:
        with _connect(settings) as conn:
            written = checkpoint.write_daily(conn, key, directory, at=when)
    except checkpoint.LedgerBroken as e:
        for finding in e.result.findings[:20]:
            log.error("ledger checkpoint: %s", finding.describe())
        log.error("ledger checkpoint: not signed, the ledger does not verify (%s)", e)
        return {"status": "refused", "breaks": e.result.breaks}
    if written is None:
        log.info("ledger checkpoint: today's is written already")
        return {"status": "exists"}
    log.info("%s", written.message)
    return written.as_dict()


@app.task(name="billing.purge_inbox")
def purge_inbox() -> dict[str, object]:
    """Remove the inbox rows past their retention (INBOX_* settings), counting each removal."""
    settings = Settings.from_env()
    with _connect(settings) as conn:
        outcome = inbox.purge(
            conn, inbox.Retention.of(settings), providers=webhooks.PROVIDERS, at=datetime.now(UTC)
        )
    log.info("%s", outcome.message)
    return {"ignored": outcome.ignored, "applied": outcome.applied, "over_bound": outcome.over_bound}

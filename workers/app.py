"""The Celery app and its beat schedule.

Settings that matter for exactly-once effects:
- `task_acks_late` + `task_reject_on_worker_lost`: a task whose worker process dies is re-queued,
  not lost; every task is safe to run twice, so a redelivery only repeats a no-op.
- The Redis `visibility_timeout` is longer than any task may run (`task_time_limit`), and no task
  is sent with an ETA or countdown, so no message is redelivered while it is still running.
- JSON only, UTC, crontab schedules written with keywords (positional crontab arguments are a trap).
- Exactly one beat. A missed or duplicated fire is absorbed anyway: the hourly catch-up tick runs a
  missed reset, and the reset's run row turns a duplicate into a no-op.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from celery import Celery
from celery.schedules import crontab

from service.config import Settings

DEFAULT_QUEUE = "quota-ledger"

# A task may run this long (a reset of tens of millions of counters; a killed or timed-out run
# resumes at the next hourly tick). The visibility timeout must stay above it.
TASK_TIME_LIMIT = 30 * 60
VISIBILITY_TIMEOUT = 2 * 60 * 60

BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    # 00:05 UTC on the 1st of every month. Keywords only: crontab(0, 0, 0, day_of_month=...)
    # would also mean "and on Sundays".
    "monthly-reset": {
        "task": "quota.monthly_reset",
        "schedule": crontab(minute=5, hour=0, day_of_month=1),
    },
    # 00:01 UTC every day: the counters of daily metrics.
    "daily-reset": {
        "task": "quota.daily_reset",
        "schedule": crontab(minute=1, hour=0),
        "options": {"expires": 50 * 60},  # a stale one is dropped; the hourly catch-up covers it
    },
    # Hourly: runs the current month's and day's resets unless their run rows say done (then no-op reads).
    "reset-catch-up": {
        "task": "quota.reset_catch_up",
        "schedule": crontab(minute=35),
        "options": {"expires": 50 * 60},  # a stale tick is dropped; the next one covers it
    },
    # Hourly: access that ends by time (RevenueCat expirations, grace periods, temporary grants) with
    # no event saying so; an account keeps paid access at most this long after its end.
    "expire-access": {
        "task": "billing.expire_access",
        "schedule": crontab(minute=45),
        "options": {"expires": 50 * 60},
    },
    # Daily: a signed checkpoint of every counter's head into LEDGER_CHECKPOINT_DIR (a no-op unless
    # it and LEDGER_CHECKPOINT_KEY are set; one file per UTC day, so a second run writes nothing).
    "ledger-checkpoint": {
        "task": "ledger.checkpoint",
        "schedule": crontab(minute=25, hour=3),
        "options": {"expires": 60 * 60},
    },
    # Hourly: the webhook inbox's retention (ignored and, if set, applied events past their days;
    # unmatched ones over the per-provider bound).
    "purge-inbox": {
        "task": "billing.purge_inbox",
        "schedule": crontab(minute=55),
        "options": {"expires": 50 * 60},
    },
    # Hourly: the expiry rows of grants past their time (credits). Not needed for correctness: takes
    # and reads ignore an expired grant at once; the rows are the ledger's account of what expired.
    "expire-grants": {
        "task": "quota.expire_grants",
        "schedule": crontab(minute=50),
        "options": {"expires": 50 * 60},
    },
    "plan-sync": {
        "task": "quota.plan_sync",
        "schedule": crontab(minute=15, hour=2),
        "options": {"expires": 60 * 60},
    },
}


def broker_url(redis_url: str) -> str:
    """REDIS_URL as kombu wants it. redis-py (and so the web app's readiness check) writes a Unix
    socket as `unix:///path?db=N`; kombu as `redis+socket:///path?virtual_host=N`."""
    parts = urlsplit(redis_url)
    if parts.scheme != "unix":
        return redis_url
    query = [("virtual_host" if k == "db" else k, v) for k, v in parse_qsl(parts.query)]
    auth = f"{parts.netloc}" if parts.netloc else ""
    return f"redis+socket://{auth}{parts.path}" + (f"?{urlencode(query)}" if query else "")


def make_app(*, redis_url: str | None = None, queue: str | None = None) -> Celery:
    """A Celery app on `redis_url` (default: REDIS_URL) whose tasks go to `queue` (default:
    WORKER_QUEUE, else 'quota-ledger'); tests use their own queue and Redis db."""
    url = redis_url or os.environ.get("REDIS_URL") or Settings.redis_url
    queue = queue or os.environ.get("WORKER_QUEUE") or DEFAULT_QUEUE
    app = Celery("quota-ledger", include=["workers.tasks"])
    app.conf.update(
        broker_url=broker_url(url),
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT},
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,  # outcomes are in job_runs, the ledger and the logs
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_time_limit=TASK_TIME_LIMIT,
        task_soft_time_limit=TASK_TIME_LIMIT - 60,
        worker_prefetch_multiplier=1,  # with acks_late: hold no second long task hostage
        # On a lost broker connection, stop running acks_late tasks: their messages are redelivered
        # and a resumed reset continues from its last committed batch (Celery 6's default).
        worker_cancel_long_running_tasks_on_connection_loss=True,
        timezone="UTC",
        enable_utc=True,
        beat_schedule=BEAT_SCHEDULE,
    )
    return app


app = make_app()

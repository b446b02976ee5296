"""The gauges an operator pages on, beside the counters of service/http/metrics.py: the database
pool of each web process, and what only the database knows (the oldest webhook event waiting for
support, the reset job's progress and last success).

Those database values are read when /metrics is scraped, with two index lookups under a short
statement timeout, not kept by the process that does the work: the reset runs in a Celery worker,
which has no /metrics of its own, a run killed midway resumes from its `job_runs` row, and an event
leaves `failed` through a replay from any process. The database is the one place that is always
right; every web replica reports the same values, so a dashboard takes their max. If the read fails,
`quota_database_gauges_up` is 0 and the rest is left out.

The pool's figures belong to each process. A daemon thread per app samples them every few seconds
(and a scrape samples its own process first), so they cost the request path nothing; under
`serve` they are summed over the live workers (multiprocess mode `livesum`). Every label value
comes from a fixed set: statuses, jobs, connection states."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, cast

from flask import Flask, current_app
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from service.db import Database, Q
from service.http.runtime import runtime
from service.quota.reset import JOB as RESET_JOB

POOL_CONNECTIONS = Gauge(
    "quota_db_pool_connections",
    "Database connections of the web processes' pools, by state: in_use or idle",
    ["state"],
    multiprocess_mode="livesum",
)
POOL_MAX = Gauge(
    "quota_db_pool_max_connections",
    "The pools' capacity (DB_POOL_SIZE per process)",
    multiprocess_mode="livesum",
)
POOL_WAITING = Gauge(
    "quota_db_pool_waiting_requests", "Requests waiting for a pooled connection", multiprocess_mode="livesum"
)
POOL_TIMEOUTS = Counter(
    "quota_db_pool_timeouts_total",
    "Requests that got no connection in time (answered 503 unavailable)",
)
_IN_USE, _IDLE = POOL_CONNECTIONS.labels("in_use"), POOL_CONNECTIONS.labels("idle")
SAMPLE_EVERY = 5.0  # seconds; well under a usual scrape interval

# The webhook statuses that wait for support, and the jobs whose runs are reported: fixed sets.
ATTENTION_STATUSES = ("unmatched", "failed")
JOBS = (RESET_JOB,)
_READ_WAIT = 0.5  # seconds, for a connection and again for the statements


class PoolSampler:
    """Copies one Database's pool statistics into the gauges; thread-safe."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.was_open = False
        self.thread: threading.Thread | None = None  # the one that samples every SAMPLE_EVERY
        self._timeouts_seen = 0
        self._lock = threading.Lock()

    def sample(self) -> None:
        stats = self.db.pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        if self.db.pool.closed:  # not opened yet (it opens on first use), or closed: it holds none
            size = idle = 0
        else:
            self.was_open = True
        with self._lock:
            _IN_USE.set(size - idle)
            _IDLE.set(idle)
            POOL_MAX.set(stats.get("pool_max", 0))
            POOL_WAITING.set(stats.get("requests_waiting", 0))
            timeouts = self.db.timeouts
            if timeouts > self._timeouts_seen:
                POOL_TIMEOUTS.inc(timeouts - self._timeouts_seen)
            self._timeouts_seen = timeouts


# The newest app's sampler: a web process serves one app, and gauges are per process, so an older
# app (tests build many) stops writing them.
_current: weakref.ref[PoolSampler] | None = None


def _sample_forever(ref: weakref.ref[PoolSampler]) -> None:
    """Until the app (which holds the sampler) is gone, has closed its pool or is not the newest."""
    while (sampler := ref()) is not None and _current is not None and _current() is sampler:
        sampler.sample()
        if sampler.was_open and sampler.db.pool.closed:
            return
        del sampler
        time.sleep(SAMPLE_EVERY)


def init_app(app: Flask) -> None:
    global _current
    sampler = app.extensions["pool_sampler"] = PoolSampler(app.extensions["quota"].db)
    _current = weakref.ref(sampler)
    sampler.thread = threading.Thread(
        target=_sample_forever, args=(weakref.ref(sampler),), name="pool-metrics", daemon=True
    )
    sampler.thread.start()


def _period_number(period: str | None) -> float:
    """'2026-11' -> 202611: a period as a gauge value that sorts and reads as the period."""
    return float(period.replace("-", "")) if period else 0.0


class DatabaseGauges(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "quota_database_gauges_up", "1 if this scrape read the database's gauges, else 0"
        )
        try:
            with runtime().connection(timeout=_READ_WAIT) as conn, conn.transaction():
                conn.execute(f"SET LOCAL statement_timeout = {int(_READ_WAIT * 1000)}")
                oldest = conn.execute(
                    Q.gauges_attention_oldest, {"statuses": list(ATTENTION_STATUSES)}
                ).fetchall()
                runs = conn.execute(Q.gauges_job_runs, {"jobs": list(JOBS)}).fetchall()
        except Exception:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _attention(dict(cast(list[tuple[str, float]], oldest)))
        yield from _jobs(runs)


def _attention(oldest: dict[str, float]) -> Iterator[GaugeMetricFamily]:
    age = GaugeMetricFamily(
        "quota_webhook_event_oldest_age_seconds",
        "Age of the oldest webhook event with this status (0: none), the ones support must look at",
        labels=["status"],
    )
    for status in ATTENTION_STATUSES:
        age.add_metric([status], oldest.get(status, 0.0))
    yield age


_JOB_GAUGES = {
    "latest_period": ("quota_job_latest_period", "The period of the job's latest run, as YYYYMM"),
    "running": ("quota_job_latest_running", "1 while the job's latest run has not finished"),
    "batches": ("quota_job_latest_batches", "Batches the latest run has committed"),
    "counters_reset": (
        "quota_job_latest_counters_reset",
        "Counters the latest run has moved into its period",
    ),
    "since_progress": (
        "quota_job_latest_seconds_since_progress",
        "Seconds since the latest run committed a batch",
    ),
    "done_period": (
        "quota_job_last_success_period",
        "The latest period the job finished, as YYYYMM (0: none)",
    ),
    "done_at": (
        "quota_job_last_success_timestamp_seconds",
        "When the job last finished a period (Unix time)",
    ),
}


def _jobs(runs: list[Any]) -> Iterator[GaugeMetricFamily]:
    columns = ("job", *_JOB_GAUGES)
    by_job = {row[0]: dict(zip(columns, row, strict=True)) for row in runs}
    for column, (name, text) in _JOB_GAUGES.items():
        family = GaugeMetricFamily(name, text, labels=["job"])
        for job, run in by_job.items():
            value = run[column]
            if column in ("latest_period", "done_period"):
                value = _period_number(value)
            family.add_metric([job], float(value or 0))
        yield family


def exposition() -> bytes:
    """This process's pool, sampled now, and the database's gauges, in the text format; inside a
    request of the app."""
    sampler: PoolSampler | None = current_app.extensions.get("pool_sampler")
    if sampler is not None:
        sampler.sample()
    registry = CollectorRegistry()  # not auto_describe: that would read the database twice
    registry.register(DatabaseGauges())
    return generate_latest(registry)

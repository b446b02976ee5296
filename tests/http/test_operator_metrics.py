"""/metrics has what an operator pages on: webhook deliveries, the oldest event waiting for support,
the reset job's progress and last success, the database pool, the key cache; every label value from
a fixed set. And deploy/grafana-dashboard.json queries only metrics that /metrics has."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from service.http import gauges
from tests.conftest import running_app
from tests.http.conftest import put_account, take

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"


def scrape(client: Any) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of /metrics: {sample name: {sorted labels: value}}."""
    r = client.get("/metrics")
    assert r.status_code == 200
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(r.get_data(as_text=True)):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]  # type: ignore[no-any-return]


@pytest.fixture
def cached_app(settings: Any) -> Iterator[Any]:
    with running_app(dataclasses.replace(settings, key_cache_seconds=60.0)) as app:
        yield app


def test_the_key_cache_counts_hits_and_misses(cached_app, keys):
    client = cached_app.test_client()
    before = scrape(client).get("quota_key_cache_lookups_total", {})
    for _ in range(3):
        client.get("/v1/accounts/nobody", headers=keys["product"])
    after = scrape(client)
    hits = value(after, "quota_key_cache_lookups_total", result="hit") - before.get((("result", "hit"),), 0)
    misses = value(after, "quota_key_cache_lookups_total", result="miss") - before.get(
        (("result", "miss"),), 0
    )
    # the first lookup is the one that reads the database (other keys may be cached from other tests)
    assert (hits, misses) == (2, 1)


def test_the_oldest_event_waiting_for_support_is_its_age(client, conn):
    assert value(scrape(client), "quota_webhook_event_oldest_age_seconds", status="failed") == 0
    conn.execute(
        "INSERT INTO webhook_events (provider, event_id, type, occurred_at, received_at, status, payload)"
        " VALUES ('stripe', 'evt_old', 'x', now(), now() - interval '2 hours', 'failed', '{}'),"
        "        ('stripe', 'evt_new', 'x', now(), now() - interval '1 minute', 'failed', '{}'),"
        "        ('stripe', 'evt_ok', 'x', now(), now() - interval '9 hours', 'applied', '{}')"
    )
    samples = scrape(client)
    assert value(samples, "quota_database_gauges_up") == 1
    assert 7200 <= value(samples, "quota_webhook_event_oldest_age_seconds", status="failed") < 7300
    assert value(samples, "quota_webhook_event_oldest_age_seconds", status="unmatched") == 0


def test_the_reset_jobs_progress_and_last_success(client, conn):
    never = scrape(client)
    assert value(never, "quota_job_last_success_period", job="monthly_reset") == 0  # a job that never ran
    conn.execute(
        "INSERT INTO job_runs (job, period, status, finished_at, batches, counters_reset, updated_at)"
        " VALUES ('monthly_reset', '2026-10', 'done', '2026-10-01T00:05Z', 9, 900, now() - interval '1 day'),"
        "        ('monthly_reset', '2026-11', 'running', NULL, 3, 300, now() - interval '30 seconds')"
    )
    s = scrape(client)
    job = {"job": "monthly_reset"}
    assert value(s, "quota_job_latest_period", **job) == 202611
    assert value(s, "quota_job_latest_running", **job) == 1
    assert (
        value(s, "quota_job_latest_batches", **job),
        value(s, "quota_job_latest_counters_reset", **job),
    ) == (3, 300)
    assert 30 <= value(s, "quota_job_latest_seconds_since_progress", **job) < 90
    assert value(s, "quota_job_last_success_period", **job) == 202610
    done_at = datetime(2026, 10, 1, 0, 5, tzinfo=UTC).timestamp()
    assert value(s, "quota_job_last_success_timestamp_seconds", **job) == done_at


def test_the_pool_in_use_waiting_and_timeouts(settings, keys):
    one = dataclasses.replace(settings, db_pool_size=1, db_pool_timeout=0.3)
    with running_app(one) as app:
        client = app.test_client()
        first = scrape(client)  # the pool opens on first use: a pool not opened yet holds nothing
        assert value(first, "quota_db_pool_connections", state="in_use") == 0
        before = first.get("quota_db_pool_timeouts_total", {}).get((), 0.0)
        rt = app.extensions["quota"]
        with rt.connection():  # the pool's only connection, held: the next request times out
            r = client.get("/v1/accounts/nobody", headers=keys["product"])
            assert r.status_code == 503, r.data
            s = scrape_without_database(app)
            assert value(s, "quota_db_pool_connections", state="in_use") == 1
            assert value(s, "quota_db_pool_max_connections") == 1
        s = scrape(client)
        # the request, and the held scrape's one read of the database's gauges
        assert value(s, "quota_db_pool_timeouts_total") - before == 2
        # the pool takes the returned connection back in the background: within a moment
        deadline = time.monotonic() + 5
        while value(s, "quota_db_pool_connections", state="in_use") != 0:
            assert time.monotonic() < deadline, "the returned connection is still counted in use"
            time.sleep(0.05)
            s = scrape(client)


def test_a_thread_samples_the_pool_between_scrapes_and_stops_with_it(settings):
    with running_app(settings) as app:
        sampler = app.extensions["pool_sampler"]
        with app.extensions["quota"].connection():
            deadline = time.monotonic() + gauges.SAMPLE_EVERY + 5
            while REGISTRY.get_sample_value("quota_db_pool_connections", {"state": "in_use"}) != 1:
                assert time.monotonic() < deadline, "no sample without a scrape"
                time.sleep(0.1)
    sampler.thread.join(timeout=gauges.SAMPLE_EVERY + 5)
    assert not sampler.thread.is_alive(), "the sampler outlives its pool"


def scrape_without_database(app: Any) -> dict[str, Any]:
    """/metrics while the pool's one connection is held: the database's gauges say they are missing."""
    s = scrape(app.test_client())
    assert value(s, "quota_database_gauges_up") == 0
    return s


def test_webhook_deliveries_are_counted_by_provider_and_status(client, keys):
    # the counter of service/http/webhooks.py, shown here so the dashboard test can rely on its name
    samples = client.get("/metrics").get_data(as_text=True)
    assert "# TYPE quota_webhook_deliveries_total counter" in samples


LABELS = {
    "status": {"unmatched", "failed"},
    "job": set(gauges.JOBS),
    "state": {"in_use", "idle"},
    "result": {"hit", "miss"},
}


def test_every_new_label_value_comes_from_a_fixed_set(client, keys, conn):
    put_account(client, keys)
    take(client, keys)
    conn.execute("INSERT INTO job_runs (job, period) VALUES ('monthly_reset', '2026-12')")
    conn.execute("INSERT INTO job_runs (job, period) VALUES ('someone_elses_job', '2026-12')")
    for name, series in scrape(client).items():
        if not name.startswith(("quota_db_pool", "quota_webhook_event", "quota_job", "quota_key_cache")):
            continue
        for labels in series:
            for label, v in labels:
                assert v in LABELS[label], (name, label, v)


# --- the dashboard -----------------------------------------------------------------------------


def dashboard_metrics() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", [])]
    assert exprs, "the dashboard queries nothing"
    names = set()
    for expr in exprs:
        # identifiers that are not PromQL functions, keywords, label names or durations
        expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
        expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)
        names |= {w for w in re.findall(r"\b[a-z_][a-z0-9_]*\b", expr) if w.startswith(("quota_", "http_"))}
    return names


def test_the_dashboard_queries_only_metrics_that_exist(client, keys, conn):
    put_account(client, keys)
    take(client, keys)
    exposed = set(scrape(client))
    body = client.get("/metrics").get_data(as_text=True)
    # a counter or histogram with no sample yet still has its TYPE line; its samples add suffixes
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)", body, re.M):
        exposed.add(family)
        if kind == "histogram":
            exposed |= {family + suffix for suffix in ("_bucket", "_count", "_sum")}
    missing = dashboard_metrics() - exposed
    assert not missing, f"the dashboard queries metrics /metrics does not have: {missing}"
    wanted = {
        "quota_webhook_deliveries_total",
        "quota_webhook_event_oldest_age_seconds",
        "quota_job_latest_counters_reset",
        "quota_job_last_success_period",
        "quota_db_pool_connections",
        "quota_db_pool_waiting_requests",
        "quota_db_pool_timeouts_total",
        "quota_key_cache_lookups_total",
    }
    assert wanted <= dashboard_metrics(), wanted - dashboard_metrics()


def test_the_operations_page_lists_every_metric(client, keys):
    body = client.get("/metrics").get_data(as_text=True)
    families = {
        f
        for f in re.findall(r"^# TYPE (\S+) ", body, re.M)
        if f.startswith(("quota_", "http_")) and not f.endswith("_created")  # a counter's start time
    }
    page = (ROOT / "docs" / "operations.md").read_text()
    missing = {f for f in families if f"`{f}`" not in page and f"`{f.removesuffix('_total')}`" not in page}
    assert not missing, f"docs/operations.md, Metrics, does not list {missing}"

"""Prometheus metrics. Under gunicorn, `serve` sets PROMETHEUS_MULTIPROC_DIR so that every worker
process writes its samples to shared files and /metrics adds them up."""

from __future__ import annotations

import os
import time

from flask import Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

TAKES = Counter("quota_takes_total", "Takes by outcome", ["outcome"])
RELEASES = Counter("quota_releases_total", "Releases by outcome", ["outcome"])
WEBHOOKS = Counter(
    "quota_webhook_deliveries_total",
    "Verified webhook deliveries by provider, inbox status, and path: one_statement, or locked (the "
    "one-statement delivery gave way to a subscription moving between accounts, or the event is a "
    "customer link or transfer); duplicates have status duplicate",
    ["provider", "status", "path"],
)
REQUEST_SECONDS = Histogram(
    "http_request_duration_seconds",
    "Request latency by route and status",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
# Label values come from fixed sets: a client picks the method and path, and every new value would
# be a new series kept for the life of the process (and of its multiprocess files).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"
UNMATCHED_ROUTE = "unmatched"


def render() -> Response:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry = REGISTRY
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)


def init_app(app: Flask) -> None:
    @app.before_request
    def _start() -> None:
        g.t0 = time.perf_counter()

    @app.after_request
    def _observe(resp: Response) -> Response:
        t0 = g.get("t0")
        if t0 is not None:
            method = request.method if request.method in METHODS else OTHER_METHOD
            route = request.url_rule.rule if request.url_rule else UNMATCHED_ROUTE
            REQUEST_SECONDS.labels(method, route, str(resp.status_code)).observe(time.perf_counter() - t0)
        return resp

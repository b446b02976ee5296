"""Prometheus metrics. `serve` sets PROMETHEUS_MULTIPROC_DIR so that every worker
process writes its samples to shared files and /metrics adds them up."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Generic, TypeVar

from flask import Flask, Response, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

M = TypeVar("M", Counter, Histogram)


class Children(Generic[M]):
    """A labelled metric's children by label values, each looked up through `labels()` once.

    `labels()` checks its arguments, turns each value into a string and takes a lock on every call
    (about 1 us), twice per take request, for the same handful of series. A child is added on its
    first use, exactly as `labels()` adds it (so /metrics shows no series before it has a sample);
    the label values come from fixed sets (below), so this stays as small as the metric itself. Two
    threads missing at once both get the one child that `labels()` keeps."""

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


TAKES = Counter("quota_takes_total", "Takes by outcome", ["outcome"])
RELEASES = Counter("quota_releases_total", "Releases by outcome", ["outcome"])
WEBHOOKS = Counter(
    "quota_webhook_deliveries_total",
    "Verified webhook deliveries by provider, inbox status, and path: one_statement, or locked (the "
    "one-statement delivery gave way to a subscription moving between accounts, or the event is a "
    "customer link or transfer); duplicates have status duplicate",
    ["provider", "status", "path"],
)
KEY_CACHE = Counter(
    "quota_key_cache_lookups_total",
    "API key lookups by result: hit (this process's cache) or miss (a database query)",
    ["result"],
)
KEY_CACHE_HIT, KEY_CACHE_MISS = KEY_CACHE.labels("hit"), KEY_CACHE.labels("miss")
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
_REQUEST_SECONDS = Children(REQUEST_SECONDS)
TAKE_OUTCOMES = Children(TAKES)


def render() -> Response:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry = REGISTRY
    from service.http import gauges

    read_now = gauges.exposition()  # first: it also samples this process's pool into the registry
    return Response(generate_latest(registry) + read_now, mimetype=CONTENT_TYPE_LATEST)


_T0 = "quota_ledger.t0"  # when the request reached the app (time.perf_counter)


class _Timed:
    """Notes when a request reaches the app, before Flask builds its context (a WSGI wrapper costs a
    call; a before_request hook costs Flask's dispatch of it on every request)."""

    def __init__(self, app: WSGIApplication) -> None:
        self.app = app

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        environ[_T0] = time.perf_counter()
        return self.app(environ, start_response)


def init_app(app: Flask) -> None:
    """Call after every other WSGI wrapper of the app, so that the timing covers them too."""

    @app.after_request
    def _observe(resp: Response) -> Response:
        req = request._get_current_object()  # type: ignore[attr-defined]  # one proxy lookup, not four
        t0 = req.environ.get(_T0)
        if t0 is not None:
            method = req.method if req.method in METHODS else OTHER_METHOD
            rule = req.url_rule
            route = rule.rule if rule else UNMATCHED_ROUTE
            _REQUEST_SECONDS.labels(method, route, str(resp.status_code)).observe(time.perf_counter() - t0)
        return resp

    app.wsgi_app = _Timed(app.wsgi_app)  # type: ignore[method-assign]

"""Liveness, readiness, metrics and the OpenAPI document (no auth)."""

from __future__ import annotations

import redis
from flask import Blueprint, Response, current_app, jsonify

from service.http import metrics
from service.http.openapi import openapi_document
from service.http.runtime import Runtime, runtime
from service.http.schemas import responses as rs

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    """Liveness: the process answers.
    ---
    get:
      responses:
        200: {description: alive, content: {application/json: {schema: Health}}}
    """
    return jsonify(rs.HEALTH.dump({"status": "ok"}))


# /readyz answers within a second even while the database or Redis does not: an orchestrator that
# times the probe out learns nothing, and one waiting on it holds a worker.
_READY_DB_WAIT = 0.5
_READY_BROKER_WAIT = 0.25


@bp.get("/readyz")
def readyz() -> tuple[Response, int]:
    """Readiness: this process can serve takes, i.e. its takes' pool reaches Postgres. A pool whose
    every connection is out serving requests is ready while they keep coming back: busy is not down.
    Exports have a pool of their own and do not decide. The Celery broker (Redis) is reported, but
    does not decide either: takes, reads and webhooks do not need it, so a broker outage must not
    take every web process out of rotation (the worker's own health check covers the broker).
    ---
    get:
      responses:
        200: {description: ready, content: {application/json: {schema: Readiness}}}
        503: {description: not ready, content: {application/json: {schema: Readiness}}}
    """
    rt = runtime()
    checks = {"database": rt.db.readiness(timeout=_READY_DB_WAIT)}
    try:
        client = redis.Redis.from_url(
            rt.settings.redis_url,
            socket_connect_timeout=_READY_BROKER_WAIT,
            socket_timeout=_READY_BROKER_WAIT,
        )
        client.ping()
        client.close()
        checks["broker"] = "ok"
    except Exception as e:
        checks["broker"] = f"error: {type(e).__name__} (informational: the web tier serves without it)"
    checks["exports"] = exports_check(rt)
    ready = checks["database"].startswith("ok")
    body = rs.READINESS.dump({"status": "ready" if ready else "unavailable", "checks": checks})
    return jsonify(body), 200 if ready else 503


def exports_check(rt: Runtime) -> str:
    """How many exports run (informational: they have their own pool and never hold a take's)."""
    return f"{rt.exports_running} of {rt.exports.pool.max_size} running (informational)"


@bp.get("/metrics")
def prometheus() -> Response:
    """Prometheus metrics (every label from a fixed set).
    ---
    get:
      responses:
        200: {description: the text exposition format, content: {text/plain: {schema: {type: string}}}}
    """
    return metrics.render()


@bp.get("/openapi.json")
def openapi() -> Response:
    """This document.
    ---
    get:
      responses:
        200: {description: OpenAPI 3, content: {application/json: {schema: {type: object}}}}
    """
    return jsonify(openapi_document(current_app))

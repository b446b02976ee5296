"""Liveness, readiness, metrics and the OpenAPI document (no auth)."""

from __future__ import annotations

import redis
from flask import Blueprint, Response, jsonify

from service.http import metrics
from service.http.openapi import openapi_document
from service.http.runtime import runtime

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


# /readyz answers within a second even while the database or Redis does not: an orchestrator that
# times the probe out learns nothing, and one waiting on it holds a worker.
_READY_DB_WAIT = 0.5
_READY_BROKER_WAIT = 0.25


@bp.get("/readyz")
def readyz() -> tuple[Response, int]:
    """Ready when this process can serve: Postgres answers. The Celery broker (Redis) is reported,
    but does not decide: takes, reads and webhooks do not need it, so a broker outage must not take
    every web process out of rotation (the worker's own health check covers the broker)."""
    rt = runtime()
    checks: dict[str, str] = {}
    try:
        with rt.connection(timeout=_READY_DB_WAIT) as conn:
            conn.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as e:
        checks["database"] = f"error: {type(e).__name__}"
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
    ready = checks["database"] == "ok"
    return jsonify({"status": "ready" if ready else "unavailable", "checks": checks}), 200 if ready else 503


@bp.get("/metrics")
def prometheus() -> Response:
    return metrics.render()


@bp.get("/openapi.json")
def openapi() -> Response:
    return jsonify(openapi_document())

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


@bp.get("/readyz")
def readyz() -> tuple[Response, int]:
    """Ready when Postgres answers and the Celery broker (Redis) answers."""
    rt = runtime()
    checks: dict[str, str] = {}
    try:
        with rt.connection() as conn:
            conn.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as e:
        checks["database"] = f"error: {type(e).__name__}"
    try:
        client = redis.Redis.from_url(rt.settings.redis_url, socket_connect_timeout=2, socket_timeout=2)
        client.ping()
        client.close()
        checks["broker"] = "ok"
    except Exception as e:
        checks["broker"] = f"error: {type(e).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return jsonify({"status": "ready" if ready else "unavailable", "checks": checks}), 200 if ready else 503


@bp.get("/metrics")
def prometheus() -> Response:
    return metrics.render()


@bp.get("/openapi.json")
def openapi() -> Response:
    return jsonify(openapi_document())

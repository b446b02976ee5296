"""The one place where errors become JSON: {"error": code, "message": text, ...details}."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import psycopg_pool
from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from service import errors

log = logging.getLogger(__name__)

STATUS: dict[type[errors.QuotaError], int] = {
    errors.UnknownAccount: 404,
    errors.UnknownTake: 404,
    errors.UnknownEvent: 404,
    errors.AccountDeleted: 410,
    errors.UnknownMetric: 422,
    errors.QuotaExhausted: 409,
    errors.IdempotencyKeyReused: 409,
    errors.CustomerAlreadyLinked: 409,
}


class ApiError(Exception):
    """An HTTP-level refusal (bad body, bad auth) raised by views and decorators."""

    def __init__(self, status: int, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


def error_code(name: str) -> str:
    """The `error` code of an HTTP status name: "Request URI Too Long" -> request_uri_too_long."""
    return name.lower().replace(" ", "_")


def error_response(status: int, code: str, message: str, **details: Any) -> tuple[Response, int]:
    return jsonify({"error": code, "message": message, **details}), status


def init_app(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api(e: ApiError) -> tuple[Response, int]:
        return error_response(e.status, e.code, e.message, **e.details)

    @app.errorhandler(errors.QuotaError)
    def _domain(e: errors.QuotaError) -> tuple[Response, int]:
        status = next((s for cls, s in STATUS.items() if isinstance(e, cls)), 500)
        if status == 500:
            log.error("unmapped domain error %r", e)
        return error_response(status, e.code, e.message, **e.details)

    @app.errorhandler(HTTPException)
    def _http(e: HTTPException) -> tuple[Response, int]:
        code = error_code(e.name or "error")
        status = e.code or 500
        resp, status = error_response(status, code, e.description or e.name)
        if status == 405 and e.get_response().headers.get("Allow"):
            resp.headers["Allow"] = e.get_response().headers["Allow"]
        return resp, status

    @app.errorhandler(psycopg.OperationalError)
    @app.errorhandler(psycopg_pool.PoolTimeout)
    def _unavailable(e: Exception) -> tuple[Response, int]:
        log.warning("database unavailable: %s", e)
        return error_response(503, "unavailable", "the database is unavailable; retry later")

    @app.errorhandler(Exception)
    def _internal(e: Exception) -> tuple[Response, int]:
        log.exception("unhandled error")
        return error_response(500, "internal_error", "internal error")

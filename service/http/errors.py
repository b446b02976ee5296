"""The one place where errors become JSON: {"error": code, "message": text, ...details}.

Every refusal is an exception that carries its own `status` and `code`: the domain's (service/errors.py)
and the few that only HTTP knows (below: authentication, a body that is not JSON, a schema's
refusal). One handler answers them all."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import psycopg
import psycopg_pool
from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from service import errors

log = logging.getLogger(__name__)


class ApiError(Exception):
    """A refusal made by the HTTP layer itself, before any domain code runs."""

    status: ClassVar[int]
    code: ClassVar[str]

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message, self.details = message, details


class Unauthorized(ApiError):
    """No API key, or one that is unknown or revoked."""

    status, code = 401, "unauthorized"


class Forbidden(ApiError):
    """The API key's role may not call this."""

    status, code = 403, "forbidden"


class InvalidJson(ApiError):
    """The body is not a JSON object."""

    status, code = 400, "invalid_json"


class ValidationFailed(ApiError):
    """The request's schema refused it; `fields` has a list of messages per field."""

    status, code = 422, "validation_failed"


def error_code(name: str) -> str:
    """The `error` code of an HTTP status name: "Request URI Too Long" -> request_uri_too_long."""
    return name.lower().replace(" ", "_")


def error_response(status: int, code: str, message: str, **details: Any) -> tuple[Response, int]:
    return jsonify({"error": code, "message": message, **details}), status


def init_app(app: Flask) -> None:
    @app.errorhandler(ApiError)
    @app.errorhandler(errors.QuotaError)
    def _refused(e: ApiError | errors.QuotaError) -> tuple[Response, int]:
        return error_response(e.status, e.code, e.message, **e.details)

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

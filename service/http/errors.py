"""The one place where errors become JSON: {"error": code, "message": text, ...details}.

Every refusal is an exception that carries its own `status` and `code`: the domain's (service/errors.py)
and the few that only HTTP knows (below: authentication, a body that is not JSON, a schema's
refusal, and what the server or werkzeug answers before a view runs). One handler answers them all.
A view declares the refusals it may answer with `@refuses`, from which the OpenAPI document lists
each route's error statuses and codes; `error_table()` lists every code for the docs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import psycopg
import psycopg_pool
from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES

from service import errors

log = logging.getLogger(__name__)


def error_code(name: str) -> str:
    """The `error` code of an HTTP status name: "Request URI Too Long" -> request_uri_too_long."""
    return name.lower().replace(" ", "_")


class Answer(Exception):
    """An error answer of the HTTP layer, with its status and code: a refusal (ApiError) or one of
    the server's own (ServerAnswer)."""

    status: ClassVar[int]
    code: ClassVar[str]

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message, self.details = message, details


class ApiError(Answer):
    """A refusal made by the HTTP layer itself, before any domain code runs."""


class Unauthorized(ApiError):
    """No API key, or one that is unknown, revoked, or rotated and past its grace."""

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


class ServerAnswer(Answer):
    """An answer of the server's own, which no view raises: what the app (service/http/inbound.py)
    or werkzeug answer before a view runs (the code of its status's name, as the handler below
    writes it, unless the class names one), and the handler's for a fault or an outage. Declared so
    that the document and the error table list them."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in vars(cls):
            cls.code = error_code(HTTP_STATUS_CODES[cls.status])


class BadRequest(ServerAnswer):
    """The request is not HTTP the server can read (a malformed request line or header): answered by
    the server itself, with no body, and the connection closed."""

    status = 400


class NotFound(ServerAnswer):
    """No route has this path (an id in it that no route's rule accepts included)."""

    status = 404


class MethodNotAllowed(ServerAnswer):
    """The route does not answer this method; `Allow` lists the ones it does."""

    status = 405


class BodyTooLarge(ServerAnswer):
    """The body is over the server's limit, whether sent with a Content-Length or chunked."""

    status = 413


class RequestLineTooLong(ServerAnswer):
    """The request's path (percent-decoded) and query are over 4094 bytes."""

    status = 414


class HeadersTooLarge(ServerAnswer):
    """The request's head is over 16 kB or has over 100 header fields: answered by the server
    itself, with no body, and the connection closed."""

    status = 431
    bodiless = True  # the document lists no content for it


class InternalError(ServerAnswer):
    """A fault of the server's own; logged."""

    status, code = 500, "internal_error"


class Unavailable(ServerAnswer):
    """The database is unavailable; retry later."""

    status, code = 503, "unavailable"


# What any route may answer, whatever its view does.
EVERY_ROUTE: tuple[type[ServerAnswer], ...] = (BodyTooLarge, RequestLineTooLong, HeadersTooLarge)

Refusal = type[Answer] | type[errors.QuotaError]
V = TypeVar("V", bound=Callable[..., Any])


def refuses(*refusals: Refusal) -> Callable[[V], V]:
    """Declare the refusals a view may answer, beyond its key's (`@require`: 401, 403) and every
    route's (EVERY_ROUTE). The OpenAPI document lists them as the route's error responses."""

    def declare(view: V) -> V:
        view.refuses = refusals  # type: ignore[attr-defined]  # read by the OpenAPI builder
        return view

    return declare


@dataclass(frozen=True)
class ErrorCode:
    """One row of the error table: a code, the status that answers it and what it means."""

    code: str
    status: int
    message: str


def _declared(cls: Refusal) -> Iterator[Refusal]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _declared(sub)


def error_table() -> list[ErrorCode]:
    """Every error code a client can meet, one row per status and code, in that order, with its
    meaning (the docstrings of the classes that answer it): the domain's errors, the HTTP layer's
    refusals and the server's own answers. A class with subclasses is a family (e.g.
    WebhookRejected), not an answer of its own."""
    meanings: dict[tuple[int, str], list[str]] = {}
    for cls in [*_declared(errors.QuotaError), *_declared(Answer)]:
        if not cls.__subclasses__():
            meanings.setdefault((cls.status, cls.code), []).append(" ".join((cls.__doc__ or "").split()))
    return [ErrorCode(code, status, " ".join(m)) for (status, code), m in sorted(meanings.items())]


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    """The JSON body of every error answer (a batch's item results included)."""
    return {"error": code, "message": message, **details}


def refusal_body(e: Answer | errors.QuotaError) -> dict[str, Any]:
    """What a refusal answers: its body (its status is `e.status`)."""
    return error_body(e.code, e.message, **e.details)


def error_response(status: int, code: str, message: str, **details: Any) -> tuple[Response, int]:
    return jsonify(error_body(code, message, **details)), status


def init_app(app: Flask) -> None:
    @app.errorhandler(Answer)
    @app.errorhandler(errors.QuotaError)
    def _refused(e: Answer | errors.QuotaError) -> tuple[Response, int]:
        return jsonify(refusal_body(e)), e.status

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
        return _refused(Unavailable("the database is unavailable; retry later"))

    @app.errorhandler(Exception)
    def _internal(e: Exception) -> tuple[Response, int]:
        log.exception("unhandled error")
        return _refused(InternalError("internal error"))

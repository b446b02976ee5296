"""What the app takes from a client before any view runs: path ids of ASCII digits only, no `//` in a
path (404, never a redirect built from the Host header), a request target of at most
MAX_TARGET_BYTES (414), and the body-size limit for streamed bodies too; the body read whole before
the app runs, and a connection whose body is refused unread (too large) closed, saying so."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, NotFound, RequestEntityTooLarge, RequestURITooLarge
from werkzeug.routing import IntegerConverter, ValidationError
from werkzeug.wsgi import get_content_length

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

MAX_BIGINT = 2**63 - 1
# The path (as the server decoded it) and query of a request, in characters: longer is 414. The
# server's own limit is on the whole head (service/serve.py), far above it; this is the one a
# client can rely on.
MAX_TARGET_BYTES = 4094
_REFUSAL = "quota_ledger.refusal"  # the HTTPException the request is answered with, before any view
_BODY_LEFT = "quota_ledger.body_left"  # bytes of the body were left on the connection
_ASCII_ID = re.compile(r"[0-9]{1,19}\Z")


def ascii_id(text: str) -> int | None:
    """The row id `text` names: ASCII digits that fit a bigint, else None. Not isdigit() or int()
    alone: both take other Unicode digits ("²" is a digit to isdigit, and not to int)."""
    if not _ASCII_ID.match(text) or int(text) > MAX_BIGINT:
        return None
    return int(text)


class AsciiInt(IntegerConverter):
    """`<int:...>` of ASCII digits that fit a bigint. Werkzeug's own matches `\\d+`, which in Python
    is any Unicode digit, and int() reads those too: /v1/takes/%D9%A1/release (an Arabic-Indic one)
    would release take 1."""

    regex = r"[0-9]+"

    def to_python(self, value: str) -> Any:
        number = ascii_id(value)
        if number is None:
            raise ValidationError()  # no route matches: 404, as for any id that names nothing
        return number


class Inbound:
    """What is refused before routing, marked for the app to answer (as JSON, timed like any answer).

    A path with `//` anywhere, leading included: werkzeug's router strips leading slashes, so
    `//v1/accounts/x` would be `/v1/accounts/x`, and merge_slashes (off, below) covers only the rest.

    The body is read whole here, up to the limit, whatever the answer will be: so a view never waits
    on the client, and no answer given before a view reads it (401, 404) leaves its bytes on a
    keep-alive connection, to be taken for the client's next request. A body over the limit is left
    unread and refused (413) whatever the route, and its connection closed (`body_left`).

    A body without Content-Length (chunked) reaches the app as a stream the server ends itself
    (`wsgi.input_terminated`), and werkzeug reads such a stream up to MAX_CONTENT_LENGTH and silently
    drops the rest. Read it here to one byte past the limit instead, so that a longer one is refused."""

    def __init__(self, app: WSGIApplication, limit: int) -> None:
        self.app, self.limit = app, limit

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if len(path) + len(environ.get("QUERY_STRING", "")) > MAX_TARGET_BYTES:
            environ[_REFUSAL] = RequestURITooLarge
        elif "//" in path:
            environ[_REFUSAL] = NotFound
        # As werkzeug reads it: None when chunked (which overrides a Content-Length) or not given,
        # 0 when malformed (ASCII digits only).
        length = get_content_length(environ)
        if length is None:
            if environ.get("wsgi.input_terminated"):
                self._read_chunked(environ)
        elif length > self.limit:
            _refuse_size(environ)
        elif length:
            environ["wsgi.input"] = io.BytesIO(environ["wsgi.input"].read(length))
        return self.app(environ, start_response)

    def _read_chunked(self, environ: WSGIEnvironment) -> None:
        """The de-chunked body, to one byte past the limit; from here on it is a body of that length."""
        body = environ["wsgi.input"].read(self.limit + 1)
        if len(body) > self.limit:
            _refuse_size(environ)
            body = b""
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)


def _refuse_size(environ: WSGIEnvironment) -> None:
    """A body over the limit: 413 (unless the path was refused first), its bytes left unread."""
    environ[_REFUSAL] = environ.get(_REFUSAL, RequestEntityTooLarge)
    environ[_BODY_LEFT] = True


def body_left(environ: WSGIEnvironment) -> bool:
    """Whether bytes of this request's body are still on the connection: refused for its size."""
    return bool(environ.get(_BODY_LEFT))


def init_app(app: Flask) -> None:
    """Call before any route is registered: the URL map's settings apply to rules as they are added."""
    app.url_map.converters["int"] = AsciiInt
    # Werkzeug would answer "//" in a path with a redirect to an absolute URL built from the Host
    # header; a path like that names no route here, so it is a 404 (Inbound refuses a leading one).
    app.url_map.merge_slashes = False
    limit = app.config["MAX_CONTENT_LENGTH"]
    app.wsgi_app = Inbound(app.wsgi_app, limit)  # type: ignore[method-assign]

    @app.before_request
    def _refuse() -> None:
        refusal: type[HTTPException] | None = request.environ.get(_REFUSAL)
        if refusal is not None:
            raise refusal()

    @app.after_request
    def _close_if_body_left(resp: Response) -> Response:
        # Bytes of the body left on the connection come before the client's next request. Say that
        # the connection closes, so that a keep-alive client opens a new one instead of failing its
        # next request (the server closes it when the app says so).
        if body_left(request.environ):
            resp.headers["Connection"] = "close"
        return resp

"""Every refusal says its own HTTP status and code, so a new one cannot fall through to a 500."""

from __future__ import annotations

from service import errors
from service.http import errors as http_errors
from service.http.runtime import ExportsBusy


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def test_every_domain_error_declares_its_status_and_code():
    domain = _subclasses(errors.QuotaError)
    assert len(domain) >= 15
    for cls in domain:
        assert "status" in vars(cls) and "code" in vars(cls), f"{cls.__name__} must declare status and code"
        assert 400 <= cls.status < 600
        assert cls.__doc__ and cls.__doc__.strip()
    codes = [cls.code for cls in domain]
    assert len(set(codes)) == len(codes)


def test_only_server_side_errors_answer_5xx():
    server_side = {errors.PlanConfigError, errors.WebhooksNotConfigured}
    for cls in _subclasses(errors.QuotaError):
        assert (cls.status >= 500) == (cls in server_side), cls


def test_every_http_refusal_declares_its_status_and_code():
    server_side = {ExportsBusy}  # the export cap: a refusal of the server's own capacity
    for cls in _subclasses(http_errors.ApiError):
        assert "status" in vars(cls) and "code" in vars(cls), cls
        assert (400 <= cls.status < 500) != (cls in server_side), cls


def test_every_answer_of_the_servers_own_has_its_status_and_code():
    server_side = {http_errors.InternalError, http_errors.Unavailable}
    for cls in _subclasses(http_errors.ServerAnswer):
        assert "status" in vars(cls) and "code" in vars(cls), cls
        assert (cls.status >= 500) == (cls in server_side), cls


def test_the_handler_answers_every_domain_error_with_its_own_status(app):
    for cls in _subclasses(errors.QuotaError):
        with app.test_request_context():
            handler = app._find_error_handler(cls(), [])  # what Flask would call for it
            assert handler is not None
            resp, status = handler(cls(detail=1))
        assert status == cls.status
        assert resp.json == {"error": cls.code, "message": cls(detail=1).message, "detail": 1}


def test_the_error_table_lists_every_answer_once_with_its_meaning():
    answers = [
        cls
        for cls in _subclasses(errors.QuotaError) + _subclasses(http_errors.Answer)
        if not cls.__subclasses__()  # a family (WebhookRejected) is no answer of its own
    ]
    table = http_errors.error_table()
    keys = [(r.status, r.code) for r in table]
    assert keys == sorted({(c.status, c.code) for c in answers})
    meaning = {(r.status, r.code): r.message for r in table}
    for cls in answers:
        assert " ".join(cls.__doc__.split()) in meaning[cls.status, cls.code]
    assert "webhook" in meaning[401, "unauthorized"] and "API key" in meaning[401, "unauthorized"]


def test_the_declared_protocol_codes_are_what_the_handler_answers(app):
    from werkzeug import exceptions

    cases = {
        http_errors.BadRequest: exceptions.BadRequest,
        http_errors.NotFound: exceptions.NotFound,
        http_errors.MethodNotAllowed: exceptions.MethodNotAllowed,
        http_errors.BodyTooLarge: exceptions.RequestEntityTooLarge,
        http_errors.RequestLineTooLong: exceptions.RequestURITooLarge,
        http_errors.HeadersTooLarge: exceptions.RequestHeaderFieldsTooLarge,
    }
    for declared, raised in cases.items():
        with app.test_request_context():
            resp, status = app._find_error_handler(raised(), [])(raised())
        assert (status, resp.json["error"]) == (declared.status, declared.code)

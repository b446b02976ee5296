"""Every refusal says its own HTTP status and code, so a new one cannot fall through to a 500."""

from __future__ import annotations

from service import errors
from service.http import errors as http_errors


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
    for cls in _subclasses(http_errors.ApiError):
        assert "status" in vars(cls) and "code" in vars(cls), cls
        assert 400 <= cls.status < 500


def test_the_handler_answers_every_domain_error_with_its_own_status(app):
    for cls in _subclasses(errors.QuotaError):
        with app.test_request_context():
            handler = app._find_error_handler(cls(), [])  # what Flask would call for it
            assert handler is not None
            resp, status = handler(cls(detail=1))
        assert status == cls.status
        assert resp.json == {"error": cls.code, "message": cls(detail=1).message, "detail": 1}

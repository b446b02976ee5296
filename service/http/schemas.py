"""Request and response schemas: validation for requests, documentation (OpenAPI) for both."""

from __future__ import annotations

import re
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate

from service.quota import periods

# \Z, not $: in Python `$` also matches before a trailing newline, which the database then refuses.
ACCOUNT_ID_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}\Z")
ACCOUNT_ID_RULE = "1-128 characters of [A-Za-z0-9._:@-]"
ACCOUNT_ID = validate.Regexp(ACCOUNT_ID_RE, error=ACCOUNT_ID_RULE)
PERIOD = validate.Regexp(periods.PERIOD_RE, error="a calendar month, YYYY-MM")
MAX_UNITS = 2**31 - 1


class StrictInt(fields.Integer):
    """A JSON integer only: no strings, floats or booleans (bool is an int in Python)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError("Not a valid integer.")
        return super()._deserialize(value, attr, data, **kwargs)


class Text(fields.String):
    """A string Postgres can store: JSON allows NUL characters and lone surrogates, text columns do not."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        text = super()._deserialize(value, attr, data, **kwargs)
        if "\x00" in text:
            raise ValidationError("Must not contain NUL characters.")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError("Not valid Unicode (lone surrogate).") from None
        return text


class AccountPut(Schema):
    kind = fields.String(required=True, validate=validate.OneOf(["user", "team"]))
    stripe_customer_id = Text(validate=validate.Length(min=1, max=255), allow_none=True)


class TakeRequest(Schema):
    metric = Text(required=True, validate=validate.Length(min=1, max=64))
    units = StrictInt(load_default=1, validate=validate.Range(min=1, max=MAX_UNITS))
    idempotency_key = Text(validate=validate.Length(min=1, max=255), allow_none=True)


class OverridePut(Schema):
    limit = StrictInt(
        required=True,
        allow_none=True,
        validate=validate.Range(min=0, max=2**63 - 1),
        metadata={"description": "null = unlimited"},
    )


class UsageQuery(Schema):
    metric = Text(required=True, validate=validate.Length(min=1, max=64))
    period = fields.String(validate=PERIOD)


# Responses (documentation only).


class Error(Schema):
    error = fields.String(required=True, metadata={"description": "stable error code"})
    message = fields.String(required=True)
    fields_ = fields.Dict(data_key="fields", metadata={"description": "per-field messages (422)"})


class MetricLimit(Schema):
    limit = fields.Integer(allow_none=True, metadata={"description": "null = unlimited"})
    limit_source = fields.String(metadata={"enum": ["override", "free_fallback", "plan"]})
    used = fields.Integer()
    remaining = fields.Integer(allow_none=True)
    period = fields.String()
    resets_at = fields.String()


class AdminMetricLimit(MetricLimit):
    plan_limit = fields.Integer(allow_none=True)
    override = fields.Dict(allow_none=True, metadata={"description": "{limit} or null when unset"})


class Account(Schema):
    id = fields.String()
    kind = fields.String()
    plan = fields.String()
    subscription_status = fields.String()
    deleted = fields.Boolean(metadata={"description": "soft-deleted by an admin: takes are refused (410)"})
    limits = fields.Dict(keys=fields.String(), values=fields.Nested(MetricLimit))


class AdminAccount(Account):
    stripe_customer_id = fields.String(allow_none=True)
    limits = fields.Dict(keys=fields.String(), values=fields.Nested(AdminMetricLimit))


class TakeResponse(Schema):
    take_id = fields.Integer()
    metric = fields.String()
    units = fields.Integer()
    used = fields.Integer()
    limit = fields.Integer(allow_none=True)
    remaining = fields.Integer(allow_none=True)
    period = fields.String()
    limit_source = fields.String()


class ReleaseResponse(Schema):
    released = fields.Boolean()
    reason = fields.String(metadata={"enum": ["already_released", "period_closed"]})
    take_id = fields.Integer()
    metric = fields.String()
    units = fields.Integer(metadata={"description": "units actually given back"})
    used = fields.Integer()
    limit = fields.Integer(allow_none=True)
    remaining = fields.Integer(allow_none=True)
    period = fields.String()
    limit_source = fields.String()


class UsageResponse(Schema):
    metric = fields.String()
    period = fields.String()
    used = fields.Integer()


class PageQuery(Schema):
    cursor = fields.String(validate=validate.Regexp(r"[0-9]{1,18}\Z", error="a cursor from next_cursor"))
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=1000))


class LedgerQuery(PageQuery):
    account_id = fields.String(validate=ACCOUNT_ID)
    metric = Text(validate=validate.Length(min=1, max=64))
    period = fields.String(validate=PERIOD)
    kind = fields.String(validate=validate.OneOf(["take", "release", "reset"]))


class AuditQuery(PageQuery):
    account_id = fields.String(validate=ACCOUNT_ID)


class PeriodQuery(Schema):
    period = fields.String(required=True, validate=PERIOD)


class ResetRequest(Schema):
    metric = Text(required=True, validate=validate.Length(min=1, max=64))


class LedgerEntry(Schema):
    id = fields.Integer()
    at = fields.String()
    account_id = fields.String()
    metric = fields.String()
    period = fields.String()
    kind = fields.String(metadata={"enum": ["take", "release", "reset"]})
    units = fields.Integer()
    used_after = fields.Integer()
    limit = fields.Integer(
        allow_none=True,
        metadata={"description": "takes: the effective limit granted against (null: unlimited)"},
    )
    take_id = fields.Integer(allow_none=True)
    idempotency_key = fields.String(allow_none=True)
    actor = fields.String()
    prev_hash = fields.String(
        allow_none=True, metadata={"description": "hex; the hash of the counter's previous row"}
    )
    hash = fields.String(metadata={"description": "hex sha256 chaining this row (README: the hash chain)"})


class LedgerPage(Schema):
    items = fields.List(fields.Nested(LedgerEntry))
    next_cursor = fields.String(allow_none=True)


class AuditEntry(Schema):
    id = fields.Integer()
    at = fields.String()
    actor = fields.String()
    action = fields.String()
    account_id = fields.String(allow_none=True)
    metric = fields.String(allow_none=True)
    old = fields.Raw(allow_none=True)
    new = fields.Raw(allow_none=True)


class AuditPage(Schema):
    items = fields.List(fields.Nested(AuditEntry))
    next_cursor = fields.String(allow_none=True)


class MismatchSchema(Schema):
    account_id = fields.String()
    metric = fields.String()
    counter_used = fields.Integer(allow_none=True)
    ledger_used = fields.Integer()
    last_used_after = fields.Integer(allow_none=True)


class ReconciliationResponse(Schema):
    period = fields.String()
    checked = fields.Integer()
    mismatches = fields.List(fields.Nested(MismatchSchema))


class ResetResponse(Schema):
    account_id = fields.String()
    metric = fields.String()
    period = fields.String()
    previous = fields.Integer()
    used = fields.Integer()


class DeleteResponse(Schema):
    id = fields.String()
    deleted = fields.Boolean()


class RestoreResponse(Schema):
    id = fields.String()
    deleted = fields.Boolean()
    restored = fields.Boolean(metadata={"description": "false: the account was not deleted; nothing changed"})

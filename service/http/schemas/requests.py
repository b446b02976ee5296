"""What the API reads: request bodies and query strings, loaded through these schemas (422 with
per-field messages for anything they refuse), and the webhook envelopes, for the document."""

from __future__ import annotations

from datetime import date
from typing import Any

from marshmallow import INCLUDE, Schema, ValidationError, fields, validate, validates_schema

from service.events.addresses import MAX_URL
from service.http.inbound import MAX_BIGINT
from service.http.schemas.fields import (
    ACCOUNT_ID,
    CURSOR,
    LEDGER_PERIOD,
    MAX_UNITS,
    USAGE_PERIOD,
    ConsumableMetric,
    Feature,
    IdempotencyKey,
    Metric,
    StrictBool,
    StrictInt,
    Text,
    one_of,
)
from service.quota.history import MAX_DAYS as MAX_HISTORY_DAYS
from service.quota.takes import MAX_LINES
from service.vocabulary import (
    ACCOUNT_ID_PATTERN,
    AccountKind,
    DeliveryStatus,
    EventType,
    InboxStatus,
    LedgerKind,
    Provider,
)

# The most takes one batch request may carry.
MAX_ITEMS = 1000


class AccountPut(Schema):
    kind = fields.String(required=True, validate=one_of(AccountKind))
    stripe_customer_id = Text(validate=validate.Length(min=1, max=255), allow_none=True)


class TakeLine(Schema):
    metric = Metric(required=True)
    units = StrictInt(load_default=1, validate=validate.Range(min=1, max=MAX_UNITS))


class TakeRequest(TakeLine):
    """A take of one metric; TakeLinesRequest takes several at once."""

    idempotency_key = IdempotencyKey(allow_none=True)


class TakeLinesRequest(Schema):
    """A multi-line take: every line is granted, or none. Distinct metrics, of any kinds."""

    lines = fields.List(
        fields.Nested(TakeLine),
        required=True,
        validate=validate.Length(min=1, max=MAX_LINES),
        metadata={"description": f"1-{MAX_LINES} lines, each naming a metric of its own"},
    )
    idempotency_key = IdempotencyKey(
        allow_none=True,
        metadata={"description": "one key for the whole take, in the same namespace as single takes' keys"},
    )

    @validates_schema
    def _distinct(self, data: dict[str, Any], **kwargs: Any) -> None:
        metrics = [line["metric"] for line in data.get("lines", [])]
        if len(set(metrics)) < len(metrics):
            raise ValidationError("each line names a metric of its own", "lines")


class TakeItem(TakeRequest):
    """One item of a batch: a single take's body and the account it takes from (the single take's
    path argument, checked as it is: an invalid one answers what a single take's path would)."""

    account_id = fields.String(required=True, metadata={"pattern": ACCOUNT_ID_PATTERN})


class TakeBatchRequest(Schema):
    items = fields.List(
        fields.Dict(),
        required=True,
        validate=validate.Length(min=1, max=MAX_ITEMS),
        metadata={
            "description": f"1-{MAX_ITEMS} objects, each a TakeItem: each validated on its own, a bad "
            "one answered 422 in its result while the others go on"
        },
    )


class OverridePut(Schema):
    limit = StrictInt(
        required=True,
        allow_none=True,
        validate=validate.Range(min=0, max=MAX_BIGINT),
        metadata={"description": "null = unlimited"},
    )


class FeaturePut(Schema):
    enabled = StrictBool(required=True)


class CheckQuery(Schema):
    """Exactly one of `metric` (with `units`) and `feature`."""

    metric = Metric()
    units = fields.Integer(
        validate=validate.Range(min=1, max=MAX_UNITS), metadata={"description": "with metric; default 1"}
    )
    feature = Feature()

    @validates_schema
    def _one_item(self, data: dict[str, Any], **kwargs: Any) -> None:
        if ("metric" in data) == ("feature" in data):
            raise ValidationError("name either a metric or a feature", "_schema")
        if "feature" in data and "units" in data:
            raise ValidationError("units applies to a metric", "units")


class ResetRequest(Schema):
    metric = Metric(required=True)


class GrantRequest(Schema):
    """An admin's grant: `units` of a consumable `metric`, on top of the plan (README "Credits")."""

    metric = ConsumableMetric(required=True)
    units = StrictInt(required=True, validate=validate.Range(min=1, max=MAX_UNITS))
    expires_at = fields.AwareDateTime(
        allow_none=True,
        metadata={
            "description": "ISO 8601 with an offset; null or absent: never expires (a time past: the "
            "grant is created ended, as it would have expired)"
        },
    )
    note = Text(allow_none=True, validate=validate.Length(max=500))
    idempotency_key = IdempotencyKey(
        required=True, metadata={"description": "the same key again answers 200 with the first grant"}
    )


class GrantsQuery(Schema):
    metric = Metric()


class UsageQuery(Schema):
    metric = Metric(required=True)
    period = fields.String(
        validate=USAGE_PERIOD,
        metadata={
            "description": "a period of the metric's kind: a month, or a day for a metric reset daily; "
            "default: the current one. An allocation has none (omit it): its usage is what is held now."
        },
    )


class UsageHistoryQuery(Schema):
    metric = Metric(required=True)
    first = fields.Date(
        required=True, data_key="from", metadata={"description": "the first day, UTC (YYYY-MM-DD)"}
    )
    last = fields.Date(
        required=True,
        data_key="to",
        metadata={"description": f"the last day, included; at most {MAX_HISTORY_DAYS} days after from"},
    )

    @validates_schema
    def _range(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "first" in data and "last" in data:
            days = (data["last"] - data["first"]).days + 1
            if days < 1:
                raise ValidationError("to is before from", "to")
            if days > MAX_HISTORY_DAYS:
                raise ValidationError(f"at most {MAX_HISTORY_DAYS} days at once, not {days}", "to")
            if data["last"] >= date.max:  # the day after it, where its range ends, does not exist
                raise ValidationError(f"to must be before {date.max.isoformat()}", "to")


class PageQuery(Schema):
    cursor = fields.String(validate=CURSOR)
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=1000))


class LedgerQuery(PageQuery):
    account_id = fields.String(validate=ACCOUNT_ID)
    # Any name, not only the plan config's: the ledger keeps rows of metrics the config has dropped.
    metric = Text(validate=validate.Length(min=1, max=64))
    period = fields.String(validate=LEDGER_PERIOD)
    kind = fields.String(validate=one_of(LedgerKind))


class AuditQuery(PageQuery):
    account_id = fields.String(validate=ACCOUNT_ID)


class EventsQuery(PageQuery):
    status = fields.String(validate=one_of(InboxStatus))
    provider = fields.String(validate=one_of(Provider))


class WebhookEndpointCreate(Schema):
    """A webhook endpoint: where events of these types are sent (docs/events.md)."""

    url = Text(
        required=True,
        validate=validate.Length(min=1, max=MAX_URL),
        metadata={"description": "https, on a public address (else 422 invalid_url with the reason)"},
    )
    events = fields.List(
        fields.String(validate=one_of(EventType)),
        required=True,
        validate=validate.Length(min=1, max=len(EventType)),
        metadata={"description": "the event types to send; each once"},
    )


class DeliveriesQuery(PageQuery):
    status = fields.String(validate=one_of(DeliveryStatus))


class PeriodQuery(Schema):
    period = fields.String(required=True, validate=LEDGER_PERIOD)


# Webhook bodies. The adapters (service/webhooks/) read these, not marshmallow: a provider's event is
# verified over its raw bytes and then parsed. The schemas say what an adapter requires of the
# envelope (anything else is 400 malformed_body), for the document; the rest of an event is the
# provider's to define, and an event this service cannot use is stored and answered 200 anyway.

EVENT_ID = validate.Length(min=1, max=255)
# Seconds (Stripe) or milliseconds (RevenueCat) since the epoch, within what a timestamp holds.
EPOCH_SECONDS = validate.Range(min=0, max=253402300799)


class StripeEvent(Schema):
    class Meta:
        unknown = INCLUDE

    object = fields.String(required=True, validate=validate.OneOf(["event"]))
    id = Text(required=True, validate=EVENT_ID)
    type = Text(
        required=True, validate=EVENT_ID, metadata={"description": "a type not handled: 200, ignored"}
    )
    created = fields.Integer(required=True, validate=EPOCH_SECONDS)


class RevenueCatEvent(Schema):
    class Meta:
        unknown = INCLUDE

    id = Text(required=True, validate=EVENT_ID)
    type = Text(required=True, validate=EVENT_ID)
    event_timestamp_ms = fields.Integer(required=True, validate=validate.Range(min=0, max=253402300799999))


class RevenueCatDelivery(Schema):
    class Meta:
        unknown = INCLUDE

    event = fields.Nested(RevenueCatEvent, required=True)


# Built once: a Schema deep-copies its declared fields on construction (as long as a request takes),
# and load() keeps no state on the instance.
ACCOUNT_PUT = AccountPut()
TAKE_REQUEST = TakeRequest()
GRANT_REQUEST = GrantRequest()
GRANTS_QUERY = GrantsQuery()
TAKE_LINES_REQUEST = TakeLinesRequest()
TAKE_ITEM = TakeItem()
TAKE_BATCH_REQUEST = TakeBatchRequest()
OVERRIDE_PUT = OverridePut()
FEATURE_PUT = FeaturePut()
CHECK_QUERY = CheckQuery()
RESET_REQUEST = ResetRequest()
USAGE_QUERY = UsageQuery()
USAGE_HISTORY_QUERY = UsageHistoryQuery()
LEDGER_QUERY = LedgerQuery()
AUDIT_QUERY = AuditQuery()
EVENTS_QUERY = EventsQuery()
PERIOD_QUERY = PeriodQuery()
WEBHOOK_ENDPOINT_CREATE = WebhookEndpointCreate()
DELIVERIES_QUERY = DeliveriesQuery()

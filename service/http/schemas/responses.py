"""What the API answers: every response body is dumped through these schemas. `Flat` is the short
dump of the hot paths' plain responses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from marshmallow import Schema, fields, validate

from service.http.schemas.fields import one_of
from service.vocabulary import (
    AccountKind,
    DeliveryStatus,
    EventType,
    GrantSource,
    InboxStatus,
    LedgerKind,
    LimitSource,
    MetricKind,
    Provider,
    ReleaseReason,
    ResetInterval,
    SubscriptionStatus,
)

_PLAIN = (fields.Integer, fields.String, fields.Boolean)


class Flat(Schema):
    """A response of plain fields, dumped on the hot paths (takes, releases, usage, webhook receipts).

    Its dump reads the declared fields by name and nothing more, because the objects dumped already
    hold the types the fields declare (the domain's frozen dataclasses, or dicts built beside the
    call): marshmallow's per-field machinery costs about 10 us a field, a tenth of a take's CPU in the
    web process. The shape stays the schema's: the names are its fields' (after only/exclude), and a
    schema with hooks, or any field but a plain Integer, String or Boolean read from the attribute of
    its own name, is dumped by marshmallow as usual. tests/http/test_schemas.py checks that both dumps
    agree for every Flat response."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        plain = not any(self._hooks.values()) and all(
            type(f) in _PLAIN and f.attribute is None and f.data_key is None
            for f in self.dump_fields.values()
        )
        self._names = tuple(self.dump_fields) if plain else None

    def dump(self, obj: Any, *, many: bool | None = None) -> Any:
        if self._names is None or many or (many is None and self.many):
            return super().dump(obj, many=many)
        if isinstance(obj, Mapping):
            return {n: obj[n] for n in self._names if n in obj}
        return {n: v for n in self._names if (v := getattr(obj, n, _MISSING)) is not _MISSING}


_MISSING = object()


class Counter(Flat):
    """A counter as every answer shows it: `remaining` is max(limit - used, 0), null when unlimited."""

    limit = fields.Integer(allow_none=True, metadata={"description": "null = unlimited"})
    limit_source = fields.String(validate=one_of(LimitSource))
    used = fields.Integer()
    remaining = fields.Integer(allow_none=True)
    period = fields.String(
        allow_none=True,
        metadata={"description": "a month, or a day for a daily metric; null for an allocation"},
    )


class Error(Schema):
    error = fields.String(required=True, metadata={"description": "stable error code"})
    message = fields.String(required=True)


class InvalidRequest(Error):
    fields_ = fields.Dict(
        data_key="fields",
        keys=fields.String(),
        values=fields.List(fields.String()),
        metadata={"description": "validation_failed: the messages per field"},
    )


class InvalidEndpoint(InvalidRequest):
    """A webhook endpoint refused: `fields` (validation_failed) or `reason` (invalid_url)."""

    reason = fields.String(metadata={"description": "invalid_url: why the webhook URL is refused"})


class LineShortfall(Schema):
    """A line of a multi-line take that did not fit: its counter's limit and what remained of it."""

    metric = fields.String()
    units = fields.Integer()
    remaining = fields.Integer(allow_none=True)
    limit = fields.Integer(allow_none=True, metadata={"description": "null = unlimited"})


class Conflict(Error, Counter):
    """quota_exhausted carries the counter as it stood (a multi-line take: `lines`, every line that
    did not fit); idempotency_key_reused the earlier take (a multi-line take's: its first line's)."""

    take_id = fields.Integer()
    grant_id = fields.Integer(
        metadata={"description": "idempotency_key_reused of a grant: the earlier grant"}
    )
    lines = fields.List(
        fields.Nested(LineShortfall),
        metadata={"description": "a multi-line take's quota_exhausted: every line that did not fit"},
    )


class MetricLimit(Counter):
    remaining = fields.Integer(
        allow_none=True,
        metadata={"description": "max(limit - used, 0) + credits; null when unlimited"},
    )
    credits = fields.Integer(
        metadata={
            "description": 'what the live grants have left (README "Credits"); used after the allowance'
        }
    )
    kind = fields.String(validate=one_of(MetricKind))
    reset = fields.String(
        allow_none=True, validate=one_of(ResetInterval), metadata={"description": "null for an allocation"}
    )
    resets_at = fields.String(allow_none=True, metadata={"description": "null for an allocation"})
    over_limit = fields.Boolean(
        metadata={"description": "used is above the limit (a downgrade, a lower override): takes are refused"}
    )


class OverrideValue(Schema):
    limit = fields.Integer(allow_none=True, metadata={"description": "null = unlimited"})


class AdminMetricLimit(MetricLimit):
    plan_limit = fields.Integer(allow_none=True)
    override = fields.Nested(OverrideValue, allow_none=True, metadata={"description": "null: none set"})


class OverrideChange(AdminMetricLimit):
    account_id = fields.String()
    metric = fields.String()
    previous = fields.Nested(OverrideValue, allow_none=True, metadata={"description": "null: none was set"})


class FeatureState(Flat):
    """A boolean feature of an account and the rule that decided it: an admin override, the free plan's
    features for a lapsed paid plan (free_fallback), else the plan's."""

    enabled = fields.Boolean()
    source = fields.String(validate=one_of(LimitSource))


class AdminFeatureState(FeatureState):
    override = fields.Boolean(allow_none=True, metadata={"description": "null: none set"})


class FeatureOverrideChange(AdminFeatureState):
    account_id = fields.String()
    feature = fields.String()
    previous = fields.Boolean(allow_none=True, metadata={"description": "null: none was set"})


def _limits(limit: type[MetricLimit]) -> fields.Dict:
    """An account's counters by metric, each shown as `limit` (an account's or an admin's view)."""
    return fields.Dict(keys=fields.String(), values=fields.Nested(limit), attribute="by_metric")


def _features(state: type[FeatureState]) -> fields.Dict:
    """An account's features by name, each shown as `state` (an account's or an admin's view)."""
    return fields.Dict(
        keys=fields.String(),
        values=fields.Nested(state),
        attribute="by_feature",
        metadata={"description": "every feature any plan names"},
    )


class Account(Schema):
    id = fields.String()
    kind = fields.String(validate=one_of(AccountKind))
    plan = fields.String()
    subscription_status = fields.String(validate=one_of(SubscriptionStatus))
    deleted = fields.Boolean(metadata={"description": "soft-deleted by an admin: takes are refused (410)"})
    limits = _limits(MetricLimit)
    features = _features(FeatureState)


class AdminAccount(Account):
    stripe_customer_id = fields.String(allow_none=True)
    limits = _limits(AdminMetricLimit)
    features = _features(AdminFeatureState)


class GrantResponse(Schema):
    """A grant (README "Credits"): `remaining` is what is left now, 0 once it ended."""

    grant_id = fields.Integer()
    metric = fields.String()
    units = fields.Integer()
    remaining = fields.Integer()
    expires_at = fields.DateTime(allow_none=True, metadata={"description": "null: never expires"})
    source = fields.String(validate=one_of(GrantSource))
    status = fields.String(
        validate=validate.OneOf(["live", "used", "expired", "voided"]),
        metadata={"description": "live; used (nothing left); expired; voided"},
    )
    note = fields.String(allow_none=True)
    created_at = fields.DateTime()
    voided_at = fields.DateTime(allow_none=True)


class GrantsResponse(Schema):
    grants = fields.List(fields.Nested(GrantResponse), metadata={"description": "newest first"})


class VoidResponse(Flat):
    grant_id = fields.Integer()
    voided = fields.Integer(metadata={"description": "units the void forfeited (what was left)"})
    used = fields.Integer(
        metadata={"description": "units takes had drawn and not given back: they stay used"}
    )


class TakeResponse(Counter):
    take_id = fields.Integer()
    metric = fields.String()
    units = fields.Integer()
    from_credits = fields.Integer(
        metadata={"description": "of `units`, those drawn from grants (0: the allowance covered the take)"}
    )


class TakeLinesResponse(Schema):
    takes = fields.List(
        fields.Nested(TakeResponse),
        metadata={"description": "one take per line, in the order of the lines; each released on its own"},
    )


class BatchResult(Conflict, TakeResponse, InvalidRequest):
    """One item's answer: `status` is what a single take would answer, and the rest its body (a
    take, or an error)."""

    status = fields.Integer(required=True, metadata={"description": "201, 200 (replayed), or an error's"})
    error = fields.String(metadata={"description": "stable error code, when status is an error's"})
    message = fields.String()


class TakeBatchResponse(Schema):
    results = fields.List(fields.Nested(BatchResult), metadata={"description": "one per item, in item order"})


class MetricCheck(Counter):
    """Whether a take of `units` would be granted now (a take alone enforces the limit)."""

    allowed = fields.Boolean()
    metric = fields.String()
    units = fields.Integer()
    period = fields.String(allow_none=True, metadata={"description": "null for an allocation"})
    resets_at = fields.String(allow_none=True, metadata={"description": "null for an allocation"})


class FeatureCheck(Flat):
    allowed = fields.Boolean()
    feature = fields.String()
    source = fields.String(validate=one_of(LimitSource))


class ReleaseResponse(TakeResponse):
    """`released: false` carries only `reason` and `take_id` (NOT_RELEASED below)."""

    class Meta:
        exclude = ("from_credits",)

    released = fields.Boolean()
    reason = fields.String(validate=one_of(ReleaseReason))
    units = fields.Integer(
        metadata={
            "description": "units actually given back, to the allowance and to live grants (a share "
            "of a grant that has ended since is forfeited)"
        }
    )


class UsageResponse(Flat):
    metric = fields.String()
    period = fields.String(allow_none=True, metadata={"description": "null for an allocation: held now"})
    used = fields.Integer()


class DayUsage(Schema):
    date = fields.Date()
    taken = fields.Integer(metadata={"description": "units taken that day"})
    released = fields.Integer(metadata={"description": "units released that day"})
    used = fields.Integer(
        metadata={"description": "the counter at the end of the day (0 once its period has ended)"}
    )


class UsageHistoryResponse(Schema):
    metric = fields.String()
    days = fields.List(
        fields.Nested(DayUsage), metadata={"description": "one per day of the range, in order"}
    )


class ResetResponse(UsageResponse):
    """The usage after an admin reset (0), and what it cleared."""

    account_id = fields.String()
    previous = fields.Integer()


class DeleteResponse(Schema):
    id = fields.String()
    deleted = fields.Boolean()


class RestoreResponse(DeleteResponse):
    restored = fields.Boolean(metadata={"description": "false: the account was not deleted; nothing changed"})


class StoredEvent(Schema):
    id = fields.Integer()
    provider = fields.String(validate=one_of(Provider))
    event_id = fields.String()
    type = fields.String()
    status = fields.String(validate=one_of(InboxStatus))
    error = fields.String(allow_none=True)
    note = fields.String(allow_none=True, metadata={"description": "stale, unmapped price, moved, ..."})
    account_id = fields.String(allow_none=True)
    subscription_id = fields.String(allow_none=True)
    customer_id = fields.String(allow_none=True)
    occurred_at = fields.DateTime(metadata={"description": "the provider's event time"})
    received_at = fields.DateTime()
    processed_at = fields.DateTime(allow_none=True)
    attempts = fields.Integer(metadata={"description": "1 + replays"})


class LedgerEntry(Schema):
    id = fields.Integer()
    at = fields.String(metadata={"format": "date-time"})
    account_id = fields.String()
    metric = fields.String()
    period = fields.String()
    kind = fields.String(validate=one_of(LedgerKind))
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
    seq = fields.Integer(
        metadata={"description": "the row's position in its counter's chain (1, 2, 3 ...; not hashed)"}
    )
    grant_id = fields.Integer(
        allow_none=True,
        metadata={"description": "a grant's row (kind grant*): the grant; hashed as a 13th field when set"},
    )


class AuditEntry(Schema):
    id = fields.Integer()
    at = fields.DateTime()
    actor = fields.String()
    action = fields.String()
    account_id = fields.String(allow_none=True)
    metric = fields.String(allow_none=True)
    old = fields.Raw(allow_none=True)
    new = fields.Raw(allow_none=True)


class Page(Schema):
    next_cursor = fields.String(allow_none=True, metadata={"description": "null: the last page"})


class LedgerPage(Page):
    items = fields.List(fields.Nested(LedgerEntry))


class AuditPage(Page):
    items = fields.List(fields.Nested(AuditEntry))


class EventsPage(Page):
    items = fields.List(fields.Nested(StoredEvent))


class WebhookEndpoint(Schema):
    """A webhook endpoint, without its secret."""

    id = fields.String()
    url = fields.String()
    events = fields.List(fields.String(validate=one_of(EventType)))
    enabled = fields.Boolean(
        metadata={"description": "false once disabled (a 410 Gone, or 5 days of failures)"}
    )
    disabled_reason = fields.String(allow_none=True)
    created_at = fields.DateTime()
    previous_secret_until = fields.DateTime(
        allow_none=True, metadata={"description": "while a rotated secret still signs too"}
    )


class WebhookEndpoints(Schema):
    items = fields.List(fields.Nested(WebhookEndpoint), metadata={"description": "oldest first"})


class WebhookEndpointSecret(Schema):
    """An endpoint with its secret: answered once, at creation or rotation, and never again."""

    id = fields.String()
    url = fields.String()
    events = fields.List(fields.String(validate=one_of(EventType)))
    enabled = fields.Boolean()
    secret = fields.String(metadata={"description": "whsec_ and base64: the Standard Webhooks secret"})
    previous_secret_until = fields.DateTime(
        allow_none=True, metadata={"description": "after a rotation: until when the old secret signs too"}
    )


class WebhookDelivery(Schema):
    id = fields.Integer()
    event_id = fields.Integer(metadata={"description": "webhook-id is evt_<event_id>"})
    type = fields.String(validate=one_of(EventType))
    status = fields.String(validate=one_of(DeliveryStatus))
    attempts = fields.Integer()
    last_status = fields.Integer(allow_none=True, metadata={"description": "the last answer's HTTP status"})
    last_error = fields.String(allow_none=True)
    next_attempt_at = fields.DateTime(metadata={"description": "when pending: the next attempt"})
    created_at = fields.DateTime()
    finished_at = fields.DateTime(allow_none=True)


class WebhookDeliveriesPage(Page):
    items = fields.List(fields.Nested(WebhookDelivery), metadata={"description": "newest first"})


class Mismatch(Schema):
    account_id = fields.String()
    metric = fields.String()
    period = fields.String(metadata={"description": "the counter's: the month, one of its days, or held"})
    counter_used = fields.Integer(allow_none=True)
    ledger_used = fields.Integer()
    last_used_after = fields.Integer(allow_none=True)


class GrantMismatch(Schema):
    account_id = fields.String()
    metric = fields.String()
    grant_id = fields.Integer()
    remaining = fields.Integer(metadata={"description": "the grant's, as stored"})
    ledger_remaining = fields.Integer(
        metadata={"description": "units - taken + released - voided - expired, from its ledger rows"}
    )


class ReconciliationResponse(Schema):
    period = fields.String()
    checked = fields.Integer()
    mismatches = fields.List(fields.Nested(Mismatch))
    grants_checked = fields.Integer(metadata={"description": "grants with a ledger row in the period"})
    grant_mismatches = fields.List(fields.Nested(GrantMismatch))


class WebhookReceipt(Flat):
    received = fields.Boolean()
    id = fields.Integer(allow_none=True, metadata={"description": "the inbox row"})
    status = fields.String(validate=one_of(InboxStatus, "received"))
    duplicate = fields.Boolean()


class Health(Schema):
    status = fields.String(validate=validate.OneOf(["ok"]))


class Readiness(Schema):
    status = fields.String(validate=validate.OneOf(["ready", "unavailable"]))
    checks = fields.Dict(
        keys=fields.String(),
        values=fields.String(),
        metadata={"description": "database (decides), broker and exports (reported only): ok or why"},
    )


class ServiceIndex(Schema):
    service = fields.String(required=True)
    version = fields.String(required=True)
    links = fields.Dict(
        keys=fields.String(),
        values=fields.String(),
        required=True,
        metadata={"description": "where to go next, by name: openapi, docs, healthz, readyz, metrics"},
    )


def page(items: Sequence[Any], limit: int) -> dict[str, Any]:
    """A page to dump: `next_cursor` is the last id of a full page; a short page is the end (null)."""
    if len(items) < limit or not items:
        return {"items": items, "next_cursor": None}
    last = items[-1]
    return {"items": items, "next_cursor": str(last["id"] if isinstance(last, dict) else last.id)}


# Built once: a Schema deep-copies its declared fields on construction (as long as a request takes),
# and dump() keeps no state on the instance.
ACCOUNT = Account()
ADMIN_ACCOUNT = AdminAccount()
OVERRIDE_CHANGE = OverrideChange()
FEATURE_OVERRIDE_CHANGE = FeatureOverrideChange()
METRIC_CHECK = MetricCheck()
FEATURE_CHECK = FeatureCheck()
TAKE = TakeResponse()
GRANT = GrantResponse()
GRANTS = GrantsResponse()
VOIDED = VoidResponse()
TAKE_LINES = TakeLinesResponse()
RELEASED = ReleaseResponse(exclude=("reason",))
NOT_RELEASED = ReleaseResponse(only=("released", "reason", "take_id"))
USAGE = UsageResponse()
USAGE_HISTORY = UsageHistoryResponse()
RESET = ResetResponse()
DELETED = DeleteResponse()
RESTORED = RestoreResponse()
STORED_EVENT = StoredEvent()
LEDGER_PAGE = LedgerPage()
AUDIT_PAGE = AuditPage()
EVENTS_PAGE = EventsPage()
WEBHOOK_ENDPOINT = WebhookEndpoint()
WEBHOOK_ENDPOINTS = WebhookEndpoints()
WEBHOOK_ENDPOINT_SECRET = WebhookEndpointSecret()
WEBHOOK_DELIVERY = WebhookDelivery()
WEBHOOK_DELIVERIES_PAGE = WebhookDeliveriesPage()
RECONCILIATION = ReconciliationResponse()
WEBHOOK_RECEIPT = WebhookReceipt()
HEALTH = Health()
READINESS = Readiness()
SERVICE_INDEX = ServiceIndex()

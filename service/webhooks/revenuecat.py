"""RevenueCat webhooks: check the Authorization header, translate the event.

RevenueCat documents no signature: the integration sends the exact Authorization header value
configured in its dashboard, which is compared in constant time with REVENUECAT_WEBHOOK_AUTH.

A subscription is identified by its store and `original_transaction_id` (stable across renewals and
resubscriptions in the store), so every event about one purchase chain orders against the others.

Access is bounded in time: `expiration_at_ms` is when the purchase's access ends (null: never, a
lifetime purchase), whether or not an EXPIRATION event ever comes; a BILLING_ISSUE's grace period
ends at `grace_period_expiration_at_ms`. A TEMPORARY_ENTITLEMENT_GRANT (a store outage: RevenueCat
grants access before the store confirms the purchase; its sample carries no product and no
transaction ids) is its own subscription of at most 24 hours, which the purchase's own events end.
The customer is RevenueCat's `original_app_user_id`: linked to the account an event resolves to, it
lets the events of the same customer that named only an anonymous id find the account later.
"""

from __future__ import annotations

import hmac
from datetime import datetime, timedelta
from typing import Any

from service.billing.events import Change, Envelope, NoChange, PlanKeys, SubscriptionChange, Transfer
from service.errors import MalformedWebhook, UntranslatableEvent, WebhooksNotConfigured, WebhookUnauthorized
from service.webhooks._json import EPOCH, integer, loads, obj, since_epoch, text, texts

PROVIDER = "revenuecat"

# Events that set access, and the status they set (None: keep the stored status). `TRIAL` in
# period_type makes an access status `trialing`.
ACCESS = "active"
STATUS_BY_TYPE: dict[str, str | None] = {
    "INITIAL_PURCHASE": ACCESS,
    "RENEWAL": ACCESS,
    "UNCANCELLATION": ACCESS,
    "SUBSCRIPTION_EXTENDED": ACCESS,
    "TEMPORARY_ENTITLEMENT_GRANT": ACCESS,
    "REFUND_REVERSED": ACCESS,
    "NON_RENEWING_PURCHASE": ACCESS,
    "CANCELLATION": None,  # auto-renew off: access continues until EXPIRATION
    "SUBSCRIPTION_PAUSED": None,  # Play pause at period end: access continues until EXPIRATION
    "BILLING_ISSUE": "past_due",  # grace period: access continues
    "EXPIRATION": "expired",
}
NO_CHANGE = {
    "TEST": "test event from the RevenueCat dashboard",
    "INVOICE_ISSUANCE": "invoice issued; no subscription change",
    "VIRTUAL_CURRENCY_TRANSACTION": "virtual currency; no subscription change",
    "EXPERIMENT_ENROLLMENT": "experiment enrollment; no subscription change",
    "SUBSCRIBER_ALIAS": "legacy alias event; no subscription change",
}
# The allowlist: any other type is stored as ignored without being translated.
ALLOWED_TYPES = frozenset({*STATUS_BY_TYPE, *NO_CHANGE, "PRODUCT_CHANGE", "TRANSFER"})

TEMPORARY_GRANT = "TEMPORARY_ENTITLEMENT_GRANT"
# RevenueCat: a temporary entitlement grant lasts at most 24 hours.
TEMPORARY_GRANT_MAX = timedelta(hours=24)


def authenticate(header: str | None, expected: str) -> None:
    """Raise WebhookUnauthorized unless `header` is exactly the configured value."""
    if not expected:
        raise WebhooksNotConfigured("REVENUECAT_WEBHOOK_AUTH is not set")
    if header is None or not hmac.compare_digest(header.encode(), expected.encode()):
        raise WebhookUnauthorized("the Authorization header is missing or wrong")


def parse(body: bytes) -> Envelope:
    """The delivery's envelope, or MalformedWebhook (nothing may be stored then)."""
    try:
        payload = body.decode("utf-8")
        data = loads(payload)
    except ValueError as e:  # UnicodeDecodeError is one
        raise MalformedWebhook(f"the body is not UTF-8 JSON this service can store ({e})") from None
    event = obj(data, "event")
    if event is None:
        raise MalformedWebhook('the body is not a RevenueCat event (an object with an "event" object)')
    return Envelope.of(
        PROVIDER,
        event_id=text(event, "id"),
        type_=text(event, "type"),
        occurred_at=since_epoch(integer(event, "event_timestamp_ms"), per_second=1000),
        time_field="event_timestamp_ms",
        body=payload,
        data=data,
    )


def environment(data: dict[str, Any]) -> str | None:
    """The event's environment, from the store transaction: "production" or "sandbox"."""
    return {"PRODUCTION": "production", "SANDBOX": "sandbox"}.get(text(data, "event", "environment") or "")


def translate(env: Envelope) -> Change:
    """What a RevenueCat event asks of our state."""
    event = obj(env.data, "event") or {}
    match env.type:
        case "TRANSFER":
            return Transfer(
                from_ids=texts(event.get("transferred_from")), to_ids=texts(event.get("transferred_to"))
            )
        case "PRODUCT_CHANGE":
            return NoChange(
                reason=f"product change to {text(event, 'new_product_id')!r} may not be in effect yet; "
                "the tier changes with the RENEWAL or INITIAL_PURCHASE that makes it so"
            )
        case t if t in NO_CHANGE:
            return NoChange(reason=NO_CHANGE[t])
        case t if t in STATUS_BY_TYPE:
            return _subscription(t, event)
        case _:
            return NoChange(reason="event type not handled")


def _subscription(type_: str, event: dict[str, Any]) -> SubscriptionChange:
    access = "trialing" if text(event, "period_type") == "TRIAL" else ACCESS
    status = STATUS_BY_TYPE[type_]
    if status == ACCESS:
        status = access
    if type_ == "CANCELLATION" and text(event, "cancel_reason") == "BILLING_ERROR":
        status = "past_due"  # sent with BILLING_ISSUE: a failed charge, still in grace
    entitlements = texts(event.get("entitlement_ids")) or texts([event.get("entitlement_id")])
    temporary = type_ == TEMPORARY_GRANT
    expires_at = _time(event, "expiration_at_ms")
    if status == "past_due":
        # A failed charge (BILLING_ISSUE, or the CANCELLATION sent with it): the period it paid for
        # has ended, and access continues through the grace period, until its end if RevenueCat
        # gives one, else until the EXPIRATION or RENEWAL that settles it.
        expires_at = _time(event, "grace_period_expiration_at_ms")
    if temporary:
        at = _time(event, "event_timestamp_ms") or EPOCH
        expires_at = min(expires_at or at + TEMPORARY_GRANT_MAX, at + TEMPORARY_GRANT_MAX)
    return SubscriptionChange(
        subscription_id=_temporary_id(event) if temporary else _subscription_id(event),
        account_ids=texts(
            [event.get("app_user_id"), event.get("original_app_user_id"), *_list(event, "aliases")]
        ),
        customer_id=text(event, "original_app_user_id") or text(event, "app_user_id"),
        plan_keys=PlanKeys(
            revenuecat_entitlements=entitlements, revenuecat_product=text(event, "product_id")
        ),
        status=status,
        status_if_new=status or access,
        opens=type_ == "INITIAL_PURCHASE",
        expires_at=expires_at,
        supersedes_temporary=not temporary,
        transaction_id=text(event, "transaction_id"),
        non_renewing=type_ == "NON_RENEWING_PURCHASE",
        cancellation=type_ == "CANCELLATION",
    )


def _time(event: dict[str, Any], key: str) -> datetime | None:
    return since_epoch(integer(event, key), per_second=1000)


def _temporary_id(event: dict[str, Any]) -> str:
    """A temporary grant's own subscription: one per store and customer (the grant stands in for a
    purchase whose transaction the store has not confirmed, so it has no transaction id)."""
    store = text(event, "store") or "UNKNOWN_STORE"
    user = text(event, "original_app_user_id") or text(event, "app_user_id")
    if not user:
        raise UntranslatableEvent("the temporary entitlement grant names no app user")
    return f"temporary:{store}:{user}"


def _list(event: dict[str, Any], key: str) -> list[Any]:
    value = event.get(key)
    return value if isinstance(value, list) else []


def _subscription_id(event: dict[str, Any]) -> str:
    store = text(event, "store") or "UNKNOWN_STORE"
    original = text(event, "original_transaction_id")
    if original:
        return f"{store}:{original}"
    user = text(event, "original_app_user_id") or text(event, "app_user_id")
    product = text(event, "product_id")
    if not user or not product:
        raise UntranslatableEvent("the event names no original_transaction_id, nor a user and product")
    return f"{store}:{user}:{product}"

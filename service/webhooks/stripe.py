"""Stripe webhooks: verify the `Stripe-Signature` header over the raw body, translate the event.

Verification is Stripe's scheme (HMAC-SHA256 of "{t}.{body}", only `v1` signatures, constant-time
compare), tried against every configured secret so that a rotation (one `v1` per active secret)
passes. The header is read exactly as stripe-python's `WebhookSignature` reads it (the first item
whose key is exactly `t`), and the HMAC is computed here over the very timestamp whose age was
checked: the library bounds only a timestamp's age, not its future, and a check of one timestamp
followed by a library call that parses another would let a signature for tomorrow through.

The verified body is read as plain JSON rather than through `stripe.Webhook.construct_event`: that
builds typed StripeObjects of the whole event, many times the work of a plain JSON parse (figures:
bench/webhooks.md), and buys nothing here, since we read a handful of fields. Those fields are read with
type checks, in the layouts of every API version Stripe still delivers: an event is rendered in the
endpoint's pinned version, so an invoice names its subscription as `parent.subscription_details`
(2025-03-31 basil and later), or as top-level `subscription` and `subscription_details` (before).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence
from typing import Any

from service.billing.events import (
    STATUSES,
    Change,
    CreditPurchase,
    CreditRefund,
    CustomerLink,
    Envelope,
    NoChange,
    PlanKeys,
    SubscriptionChange,
)
from service.errors import InvalidSignature, MalformedWebhook, UntranslatableEvent, WebhooksNotConfigured
from service.webhooks._json import integer, loads, obj, since_epoch, text

PROVIDER = "stripe"
TOLERANCE = 300  # seconds, in both directions
SCHEME = "v1"  # the only scheme stripe-python checks; Stripe's v0 test signatures are never trusted

SUBSCRIPTION_EVENTS = frozenset(
    {
        "customer.subscription.created",
        "customer.subscription.updated",
        "customer.subscription.deleted",
        "customer.subscription.paused",
        "customer.subscription.resumed",
    }
)
INVOICE_EVENTS = frozenset(
    {"invoice.paid", "invoice.payment_succeeded", "invoice.payment_failed", "invoice.payment_action_required"}
)
# The allowlist: any other type is stored as ignored without being translated.
PAID_CHECKOUT = frozenset({"checkout.session.completed", "checkout.session.async_payment_succeeded"})
ALLOWED_TYPES = SUBSCRIPTION_EVENTS | INVOICE_EVENTS | PAID_CHECKOUT | {"charge.refunded"}
MAX_PACKS = 1000  # metadata.quantity: at most this many packs in one purchase

# Stripe subscription status -> ours. incomplete_expired is terminal: the first invoice was never paid.
STATUS = {s: s for s in STATUSES} | {"incomplete_expired": "expired"}
# Statuses after which Stripe never reopens a subscription (a new one gets a new id).
FINAL = frozenset({"canceled", "incomplete_expired"})


def verify(body: bytes, header: str | None, secrets: Sequence[str], *, now: float | None = None) -> Envelope:
    """The verified delivery, or InvalidSignature / MalformedWebhook (nothing may be stored then)."""
    if not secrets:
        raise WebhooksNotConfigured("STRIPE_WEBHOOK_SECRETS is not set")
    if not header:
        raise InvalidSignature("the Stripe-Signature header is missing")
    signed_at, signatures = parse_header(header)
    now = time.time() if now is None else now
    if abs(signed_at - int(now)) > TOLERANCE:  # in ints: a float of t=1e400 would overflow
        raise InvalidSignature(f"the signature timestamp is more than {TOLERANCE} s from now")
    if not signatures:
        raise InvalidSignature(f"the Stripe-Signature header has no {SCHEME} signature")
    try:
        payload = body.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedWebhook("the body is not UTF-8") from None
    signed = f"{signed_at}.".encode() + body
    expected = [hmac.new(s.encode(), signed, hashlib.sha256).hexdigest().encode() for s in secrets]
    # Every pair is compared (no early exit), so the time taken says nothing about which one matched.
    matches = [hmac.compare_digest(e, sig.encode("utf-8", "replace")) for e in expected for sig in signatures]
    if not any(matches):
        raise InvalidSignature(f"no {SCHEME} signature matches the body with a configured secret")
    return _envelope(payload)


def parse_header(header: str) -> tuple[int, list[str]]:
    """(timestamp, v1 signatures) of a Stripe-Signature header, read as stripe-python's
    `WebhookSignature._get_timestamp_and_signatures` reads it: items split on "," and each on "="
    (at most twice), no blanks stripped, the first item whose key is exactly "t" is the timestamp.
    InvalidSignature where the library fails to parse."""
    items = [item.split("=", 2) for item in header.split(",")]
    try:
        # Whole lists, as the library builds them: a bare "t" or "v1" item anywhere fails the parse.
        timestamps = [i[1] for i in items if i[0] == "t"]
        timestamp = int(timestamps[0])
        signatures = [i[1] for i in items if i[0] == SCHEME]
    except (IndexError, ValueError):
        raise InvalidSignature("the Stripe-Signature header has no valid t= timestamp") from None
    return timestamp, signatures


def _envelope(payload: str) -> Envelope:
    try:
        data = loads(payload)
    except ValueError as e:
        raise MalformedWebhook(f"the body is not JSON this service can store ({e})") from None
    if not isinstance(data, dict) or data.get("object") != "event":
        raise MalformedWebhook('the body is not a Stripe event (an object with "object": "event")')
    return Envelope.of(
        PROVIDER,
        event_id=text(data, "id"),
        type_=text(data, "type"),
        occurred_at=since_epoch(integer(data, "created")),
        time_field="created timestamp",
        body=payload,
        data=data,
    )


def environment(data: dict[str, Any]) -> str | None:
    """The event's environment: "production" for a live-mode event, "sandbox" for a test-mode one."""
    livemode = data.get("livemode")
    return None if not isinstance(livemode, bool) else "production" if livemode else "sandbox"


def translate(env: Envelope) -> Change:
    """What a verified Stripe event asks of our state."""
    if env.type not in ALLOWED_TYPES:
        return NoChange(reason="event type not handled")
    o = obj(env.data, "data", "object")
    if o is None:
        raise UntranslatableEvent("the event has no data.object")
    match env.type:
        case t if t in SUBSCRIPTION_EVENTS:
            return _subscription(o, env.type)
        case t if t in PAID_CHECKOUT and text(o, "metadata", "credit_pack") is not None:
            return _purchase(o)
        case "checkout.session.async_payment_succeeded":
            return NoChange(reason="a checkout session that names no credit_pack")
        case "charge.refunded":
            return _refund(o)
        case "checkout.session.completed":
            return _link(
                o,
                accounts=(text(o, "client_reference_id"), text(o, "metadata", "account_id")),
                subscription=_id(o.get("subscription")),
                what="checkout session",
            )
        case t if t in INVOICE_EVENTS:
            # basil and later: parent.subscription_details; before: top-level subscription_details
            # (metadata only) and subscription.
            details = obj(o, "parent", "subscription_details") or obj(o, "subscription_details")
            return _link(
                o,
                accounts=(text(details, "metadata", "account_id"),),
                subscription=_id((details or {}).get("subscription")) or _id(o.get("subscription")),
                what="invoice",
            )
        case _:  # pragma: no cover - every allowed type has a case
            return NoChange(reason="event type not handled")


def _purchase(session: dict[str, Any]) -> Change:
    """A paid checkout session in payment mode that names a credit pack (metadata.credit_pack, and
    metadata.quantity packs, default 1): one purchase, keyed by the session's id."""
    session_id = text(session, "id")
    if not session_id:
        raise UntranslatableEvent("the checkout session has no id")
    if text(session, "mode") != "payment":
        return NoChange(
            reason=f"a {text(session, 'mode')} checkout session; credit packs are bought in payment mode"
        )
    if text(session, "payment_status") != "paid":
        return NoChange(
            reason=f"payment_status {text(session, 'payment_status')!r}: granted when "
            "checkout.session.async_payment_succeeded says it is paid"
        )
    raw = text(session, "metadata", "quantity") or "1"
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_PACKS:
        raise UntranslatableEvent(f"metadata.quantity {raw!r} is not a whole number from 1 to {MAX_PACKS}")
    accounts = (text(session, "client_reference_id"), text(session, "metadata", "account_id"))
    return CreditPurchase(
        reference=session_id,
        account_ids=tuple(dict.fromkeys(a for a in accounts if a)),
        customer_id=_id(session.get("customer")),
        pack=text(session, "metadata", "credit_pack"),
        quantity=int(raw),
        payment_ref=_id(session.get("payment_intent")),
    )


def _refund(charge: dict[str, Any]) -> Change:
    """A refunded charge: the credits its payment bought lose the refunded share."""
    payment = _id(charge.get("payment_intent"))
    amount, refunded = integer(charge, "amount"), integer(charge, "amount_refunded")
    if not payment:
        return NoChange(reason="the charge names no payment intent: no checkout session paid by it")
    if amount is None or refunded is None or amount <= 0 or not 0 <= refunded <= amount:
        raise UntranslatableEvent(
            f"the charge's amount {amount!r} and amount_refunded {refunded!r} do not add up"
        )
    return CreditRefund(payment_ref=payment, amount=amount, amount_refunded=refunded)


def _subscription(sub: dict[str, Any], type_: str) -> SubscriptionChange:
    sub_id, raw_status = text(sub, "id"), text(sub, "status")
    if not sub_id:
        raise UntranslatableEvent("the subscription has no id")
    status = STATUS.get(raw_status or "")
    if status is None:
        raise UntranslatableEvent(f"unknown subscription status {raw_status!r}")
    account = text(sub, "metadata", "account_id")
    return SubscriptionChange(
        subscription_id=sub_id,
        account_ids=(account,) if account else (),
        customer_id=_id(sub.get("customer")),
        plan_keys=PlanKeys(stripe_prices=_prices(sub)),
        status=status,
        status_if_new=status,
        final=raw_status in FINAL,
        opens=type_ == "customer.subscription.created",
    )


def _prices(sub: dict[str, Any]) -> tuple[str, ...]:
    """Lookup keys and ids of the subscription's item prices (the legacy `plan` mirror as fallback)."""
    items = obj(sub, "items")
    data = items.get("data") if items else None
    keys: list[str] = []
    for item in data if isinstance(data, list) else []:
        price = obj(item, "price") or obj(item, "plan")
        for key in (text(price, "lookup_key"), text(price, "id")):
            if key and key not in keys:
                keys.append(key)
    return tuple(keys)


def _link(
    o: dict[str, Any], *, accounts: tuple[str | None, ...], subscription: str | None, what: str
) -> Change:
    """A link of the object's customer to the account it names, or to its subscription's owner, or
    (for support's sake) the account the customer is linked to already."""
    customer = _id(o.get("customer"))
    if not customer:
        return NoChange(reason=f"the {what} names no customer")
    named = tuple(dict.fromkeys(a for a in accounts if a))
    return CustomerLink(customer_id=customer, account_ids=named, subscription_id=subscription)


def _id(value: Any) -> str | None:
    """An id field that may be expanded into its object."""
    return text(value, "id") if isinstance(value, dict) else text(value)

"""Sample webhook events for trying a running service, as `stripe trigger` does: the providers'
published sample payloads (shipped in samples/, which the tests read too) with ids and times made
current and the account and customer put in. Each event is signed (Stripe) or authorised
(RevenueCat) with the credentials the service reads, so it takes the same path as a real delivery.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).parent / "samples"
DAY = 86_400
PERIOD = 30 * DAY  # the length of a sample subscription period

STRIPE_ACTIVATES = "customer.subscription.created"


@dataclass(frozen=True)
class SampleEvent:
    name: str
    help: str


STRIPE_EVENTS = (
    SampleEvent(STRIPE_ACTIVATES, "a new active subscription to the pro plan (activates paid access)"),
    SampleEvent("customer.subscription.deleted", "that subscription canceled (the free plan's limits again)"),
)
REVENUECAT_EVENTS = (
    SampleEvent("INITIAL_PURCHASE", "a purchase granting the pro entitlement (activates paid access)"),
    SampleEvent("EXPIRATION", "that purchase expired (the free plan's limits again)"),
)
EVENTS = {"stripe": STRIPE_EVENTS, "revenuecat": REVENUECAT_EVENTS}


def load(provider: str, name: str) -> dict[str, Any]:
    """A shipped sample payload as published, unchanged."""
    data: dict[str, Any] = json.loads((SAMPLES / provider / f"{name}.json").read_text())
    return data


def _ids(account_id: str) -> tuple[str, str]:
    """The subscription and customer ids of an account's sample events: the same for every event
    of one account, so that a cancellation finds the subscription a creation made."""
    digest = hashlib.sha256(account_id.encode()).hexdigest()[:16]
    return f"sub_test_{digest}", f"cus_test_{digest}"


def stripe_event(name: str, *, account_id: str, now: int | None = None) -> dict[str, Any]:
    """A test-mode Stripe subscription event for `account_id` (its metadata names the account)."""
    now = int(time.time()) if now is None else now
    sub_id, customer = _ids(account_id)
    event = load("stripe", "customer.subscription.updated")
    event.update(id=f"evt_test_{secrets.token_hex(12)}", created=now, type=name, livemode=False)
    event["data"].pop("previous_attributes", None)
    sub = event["data"]["object"]
    canceled = name == "customer.subscription.deleted"
    sub.update(id=sub_id, customer=customer, metadata={"account_id": account_id}, livemode=False)
    sub.update(
        created=now, start_date=now, billing_cycle_anchor=now, status="canceled" if canceled else "active"
    )
    if canceled:
        sub.update(canceled_at=now, ended_at=now)
    for item in sub["items"]["data"]:
        item.update(
            subscription=sub_id, created=now, current_period_start=now, current_period_end=now + PERIOD
        )
    return event


def revenuecat_event(name: str, *, account_id: str, now: int | None = None) -> dict[str, Any]:
    """A sandbox RevenueCat event for `account_id` as the app user, on one App Store purchase."""
    now_ms = int((time.time() if now is None else now) * 1000)
    event = load("revenuecat", "initial_purchase")
    e = event["event"]
    transaction = str(int(hashlib.sha256(account_id.encode()).hexdigest()[:12], 16))
    e.update(id=str(uuid.uuid4()), type=name, environment="SANDBOX", event_timestamp_ms=now_ms)
    e.update(app_user_id=account_id, original_app_user_id=account_id, aliases=[account_id])
    e.update(transaction_id=transaction, original_transaction_id=transaction, purchased_at_ms=now_ms)
    e["expiration_at_ms"] = now_ms if name == "EXPIRATION" else now_ms + PERIOD * 1000
    if name == "EXPIRATION":
        e["expiration_reason"] = "UNSUBSCRIBE"
    return event


def build(provider: str, name: str, *, account_id: str) -> dict[str, Any]:
    if name not in {e.name for e in EVENTS[provider]}:
        raise ValueError(f"no sample {provider} event {name!r}")
    return (stripe_event if provider == "stripe" else revenuecat_event)(name, account_id=account_id)


def stripe_signature(body: bytes, secret: str) -> str:
    """The Stripe-Signature header for `body`, built by the official library as Stripe signs."""
    import stripe  # here: the CLI imports this module on every command

    header: str = stripe.WebhookSignature.generate_signature_header(body.decode(), secret)
    return header

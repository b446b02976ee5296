"""Provider-neutral billing events: what the webhook adapters translate provider payloads into.

An adapter verifies a delivery and produces an `Envelope` (the inbox row's identity: provider, event
id, type, provider time, raw payload). Translating the payload gives one `Change`: what the event asks
of our state. The billing domain (`service.billing.apply`) knows only these types, never a provider's
payload shape; the adapters know nothing about storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.errors import MalformedWebhook
from service.vocabulary import PROVIDER_STATUSES

STATUSES = PROVIDER_STATUSES  # the subscription statuses a provider can give


@dataclass(frozen=True, kw_only=True)
class Envelope:
    """A verified delivery: the identity of its inbox row, the body as received and as parsed."""

    provider: str  # "stripe" | "revenuecat"
    event_id: str
    type: str
    occurred_at: datetime  # the provider's event time (Stripe `created`, RevenueCat `event_timestamp_ms`)
    body: str = field(repr=False)
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def of(
        cls,
        provider: str,
        *,
        event_id: str | None,
        type_: str | None,
        occurred_at: datetime | None,
        time_field: str,
        body: str,
        data: dict[str, Any],
    ) -> Envelope:
        """The envelope of a parsed delivery, or MalformedWebhook when the id, type or event time
        (`time_field`, named in the message) is missing or will not fit the inbox."""
        if not event_id or len(event_id) > 255 or not type_ or len(type_) > 255:
            raise MalformedWebhook("the event has no valid id or type")
        if occurred_at is None:
            raise MalformedWebhook(f"the event has no valid {time_field}")
        return cls(
            provider=provider, event_id=event_id, type=type_, occurred_at=occurred_at, body=body, data=data
        )


@dataclass(frozen=True, kw_only=True)
class PlanKeys:
    """What the event says the subscription is for; the plan config maps it to a plan."""

    stripe_prices: tuple[str, ...] = ()  # price lookup keys and price ids
    revenuecat_entitlements: tuple[str, ...] = ()
    revenuecat_product: str | None = None

    def describe(self) -> str:
        keys = [*self.stripe_prices, *self.revenuecat_entitlements]
        if self.revenuecat_product:
            keys.append(self.revenuecat_product)
        return ", ".join(repr(k) for k in keys) or "(none)"


@dataclass(frozen=True, kw_only=True)
class SubscriptionChange:
    """Set one subscription's plan and status, as of the event's provider time.

    `status` None keeps the stored status (an event that does not change access, e.g. a RevenueCat
    CANCELLATION); `status_if_new` is used when nothing is stored yet. `final` says the provider never
    reopens the subscription after this status (Stripe `canceled`), so no later event may either.
    `opens`: the event creates the subscription (Stripe `customer.subscription.created`), so at an
    equal provider time it never overrides a stored state. `expires_at`: when access ends without
    another event (None: no end in time); an end already passed grants nothing.
    `supersedes_temporary`: the event is about a real purchase, which ends the account's temporary
    grants of this provider (RevenueCat TEMPORARY_ENTITLEMENT_GRANT).
    """

    subscription_id: str
    account_ids: tuple[str, ...]  # accounts the event names, most authoritative first
    customer_id: str | None = None  # a provider customer to link to the resolved account
    plan_keys: PlanKeys
    status: str | None
    status_if_new: str
    final: bool = False
    opens: bool = False
    expires_at: datetime | None = None
    supersedes_temporary: bool = False
    # RevenueCat: the store's transaction id (NON_RENEWING_PURCHASE, CANCELLATION), by which a
    # product that is a credit pack is granted once, and its refund voided (apply.credits_or)
    transaction_id: str | None = None
    non_renewing: bool = False  # a one-time purchase (RevenueCat NON_RENEWING_PURCHASE)
    cancellation: bool = False  # RevenueCat CANCELLATION: of a one-time purchase, a refund


@dataclass(frozen=True, kw_only=True)
class CustomerLink:
    """Link a provider customer to an account (e.g. a completed Stripe checkout, an invoice); no
    state changes. The account is the first of `account_ids` that exists, else the owner of
    `subscription_id`, else the account the customer is linked to already."""

    customer_id: str
    account_ids: tuple[str, ...]
    subscription_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """Move the provider's subscriptions of `from_ids` accounts to the first known of `to_ids`."""

    from_ids: tuple[str, ...]
    to_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class CreditPurchase:
    """A credit pack bought once (README "Credits"): grant it to the account, once per `reference`
    (a Stripe checkout session id, a RevenueCat transaction id). The pack is named (`pack`: Stripe's
    metadata.credit_pack) or found by its store product (`product`: RevenueCat); `quantity` packs.
    `payment_ref`: the payment whose refund voids it (a Stripe payment intent). The account is the
    first of `account_ids` that exists, else the customer's linked account; none: stored unmatched."""

    reference: str
    account_ids: tuple[str, ...]
    customer_id: str | None = None
    pack: str | None = None
    product: str | None = None
    quantity: int = 1
    payment_ref: str | None = None


@dataclass(frozen=True, kw_only=True)
class CreditRefund:
    """A refund of a credit purchase: void, forward-only, the refunded share of its grant (Stripe:
    `amount_refunded` / `amount` of the payment `payment_ref`, a running total, rounded up) or
    what is left of it (RevenueCat: the transaction `reference`, `amount` None)."""

    reference: str | None = None
    payment_ref: str | None = None
    amount: int | None = None
    amount_refunded: int | None = None


@dataclass(frozen=True, kw_only=True)
class NoChange:
    """A known event that changes nothing here (stored as ignored); `reason` says why."""

    reason: str


Change = SubscriptionChange | CustomerLink | Transfer | CreditPurchase | CreditRefund | NoChange

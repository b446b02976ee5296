"""The delivery's resolve and apply stages: find and lock the account a change is for, then apply
the change to subscriptions, customer links and the account's tier and status.

Every rule is SQL's (migrations/repeatable/billing_rules.sql): which subscription decides an
account's tier (billing_set_tier), that a customer keeps its first account (billing_link_customer),
the ordering of events and the lapse rule (billing_deliver). Python picks the account, builds the
parameters and turns the answer into an `Outcome`. Nothing here touches usage, the ledger or an
override; plan limits follow the tier in quota's SQL, which billing's SQL calls. Everything runs in
the caller's transaction, except `deliver_subscription`, which is its own.

One shard per account on Citus: the account is found by a read of the billing tables, then locked
by its id, and every statement that reads or writes an account's tables names it. Several accounts
are locked one statement each, in id order (docs/design/billing.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import cast

import psycopg
from psycopg.rows import class_row, dict_row

from service.billing.events import (
    Change,
    CreditPurchase,
    CreditRefund,
    CustomerLink,
    Envelope,
    NoChange,
    PlanKeys,
    SubscriptionChange,
    Transfer,
)
from service.db import Connection, Positional, Q
from service.errors import UntranslatableEvent
from service.plans import PlanConfig, array_literal

_DELIVER = Positional.of(Q.billing_deliver)

# billing_deliver's answer when the account it was given (the event's first named id) does not
# exist: nothing was written; find the account (find_account) and run it again.
UNRESOLVED = "unresolved"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What became of one event: its inbox status (applied, ignored, unmatched, failed) and the
    columns its row keeps. `inbox_id`: the row the one-statement delivery stored (None: a duplicate,
    or stored by the caller). `moved_from`: the account a subscription left. `waiting`: stored
    unmatched events may apply now (delivery.apply_waiting)."""

    status: str
    account_id: str | None = None
    subscription_id: str | None = None
    customer_id: str | None = None
    note: str | None = None
    error: str | None = None
    inbox_id: int | None = None
    moved_from: str | None = None
    waiting: bool = False


@dataclass(frozen=True, kw_only=True)
class AccountKeys:
    """What names the account a change is for (see the billing_account statement)."""

    account_ids: tuple[str, ...]
    subscription_id: str | None = None
    customer_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class LockedAccount:
    """An account locked for a billing change until commit, with its tier and status."""

    id: str
    plan: str
    subscription_status: str


def plan_for(plans: PlanConfig, keys: PlanKeys) -> str | None:
    """The plan these provider keys map to in the plan config, or None."""
    if keys.stripe_prices:
        return plans.plan_for_stripe_price(*keys.stripe_prices)
    if keys.revenuecat_entitlements or keys.revenuecat_product:
        return plans.plan_for_revenuecat(list(keys.revenuecat_entitlements), keys.revenuecat_product)
    return None


def credits_or(plans: PlanConfig, change: Change) -> Change:
    """Where billing decides that an event is about credits (README "Credits"): a RevenueCat
    one-time purchase of a product that a credit pack lists is that pack's purchase, keyed by its
    transaction, and its CANCELLATION a refund; any other event of such a product changes nothing
    (a product belongs to a plan or a pack, never both: service/plans.py). Anything else is as given."""
    if not isinstance(change, SubscriptionChange) or not change.transaction_id:
        return change
    product = change.plan_keys.revenuecat_product
    pack = plans.pack_for_revenuecat_product(product)
    if pack is None:
        return change
    if change.non_renewing:
        return CreditPurchase(
            reference=change.transaction_id,
            account_ids=change.account_ids,
            customer_id=change.customer_id,
            product=product,
        )
    if change.cancellation:
        return CreditRefund(reference=change.transaction_id)
    return NoChange(
        reason=f"product {product!r} is the credit pack {pack.name!r}: only its purchase and refund count"
    )


def account_keys(
    change: SubscriptionChange | CustomerLink | Transfer | CreditPurchase | CreditRefund,
) -> AccountKeys:
    """How to find the account `change` is for (a refund's: its grant's, found by resolve)."""
    match change:
        case CreditPurchase():
            return AccountKeys(account_ids=change.account_ids, customer_id=change.customer_id)
        case CreditRefund():
            return AccountKeys(account_ids=())
        case SubscriptionChange() | CustomerLink():
            return AccountKeys(
                account_ids=change.account_ids,
                subscription_id=change.subscription_id,
                customer_id=change.customer_id,
            )
        case Transfer():
            return AccountKeys(account_ids=change.to_ids)


def find_account(conn: Connection, provider: str, keys: AccountKeys) -> str | None:
    """The id of the first existing account `keys` name (the ids in order, the subscription's owner,
    the customer's linked account, product link first), read without a lock; None: unmatched."""
    params = {
        "provider": provider,
        "account_ids": list(keys.account_ids),
        "subscription_id": keys.subscription_id,
        "customer_id": keys.customer_id,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.billing_account, params).fetchone()
    return None if row is None else str(row["account_id"])


def resolve(conn: Connection, provider: str, change: Change) -> LockedAccount | None:
    """The account `change` is for (find_account), locked until commit and its billing_version
    bumped; None: unmatched, or nothing to resolve (NoChange). Never creates an account. Found, then
    locked by its id: two statements, so that on Citus the lock is on the account's shard alone."""
    if isinstance(change, NoChange):
        return None
    if isinstance(change, CreditRefund):
        bought = _purchased(conn, provider, change, account_id=None)
        return None if bought is None else lock_account(conn, str(bought["account_id"]))
    account_id = find_account(conn, provider, account_keys(change))
    return None if account_id is None else lock_account(conn, account_id)


def lock_account(conn: Connection, account_id: str) -> LockedAccount | None:
    """Lock one account for a billing change (account_lock); None: no such account."""
    with conn.cursor(row_factory=class_row(LockedAccount)) as cur:
        return cur.execute(Q.account_lock, {"account_id": account_id}).fetchone()


def lock_accounts(conn: Connection, account_ids: Iterable[str]) -> list[LockedAccount]:
    """Lock these accounts in id order, one statement each (each on its shard on Citus; the order
    keeps two callers from deadlocking); returns those that exist."""
    locked = (lock_account(conn, account_id) for account_id in sorted(set(account_ids)))
    return [account for account in locked if account is not None]


def set_tier(conn: Connection, plans: PlanConfig, accounts: Iterable[LockedAccount], *, actor: str) -> None:
    """Each locked account follows its deciding subscription (billing_set_tier: its tier, status
    and, when they change, its plan limits, audited)."""
    for account in accounts:
        conn.execute(
            Q.billing_set_tier,
            {
                "account_id": account.id,
                "plan": account.plan,
                "status": account.subscription_status,
                "actor": actor,
                **plans.limit_table,
            },
        )


def apply_change(
    conn: Connection,
    plans: PlanConfig,
    env: Envelope,
    change: Change,
    account: LockedAccount | None,
    *,
    actor: str,
) -> Outcome:
    """Apply `change` (translated from `env`) for `account`, which the caller resolved and locked
    (None: unmatched); say what happened. The inbox row is the caller's."""
    match change:
        case NoChange(reason=reason):
            return Outcome(status="ignored", note=reason)
        case SubscriptionChange():
            return _subscription(conn, plans, env, change, account, actor=actor)
        case CustomerLink():
            return _link(conn, env, change, account)
        case Transfer():
            return _transfer(conn, plans, env, change, account, actor=actor)
        case CreditPurchase():
            return _credit_purchase(conn, plans, env, change, account, actor=actor)
        case CreditRefund():
            return _credit_refund(conn, env, change, account, actor=actor)


def _credit_purchase(
    conn: Connection,
    plans: PlanConfig,
    env: Envelope,
    change: CreditPurchase,
    account: LockedAccount | None,
    *,
    actor: str,
) -> Outcome:
    """Grant the pack, once per purchase; its expiry counts from the purchase, whenever it applies."""
    if account is None:
        return Outcome(
            status="unmatched",
            customer_id=change.customer_id,
            note=unmatched_note(change.account_ids, change.customer_id),
        )
    pack = (
        plans.packs.get(change.pack or "")
        if change.product is None
        else plans.pack_for_revenuecat_product(change.product)
    )
    if pack is None:
        raise UntranslatableEvent(f"no credit pack {change.pack or change.product!r} in the plan config")
    units = pack.units * change.quantity
    days = pack.expires_after_days
    params = {
        "account_id": account.id,
        "metric": pack.metric,
        "units": units,
        "expires_at": None if days is None else env.occurred_at + timedelta(days=days),
        "provider": env.provider,
        "reference": change.reference,
        "note": f"{pack.name} x {change.quantity} ({env.provider} {change.reference})",
        "actor": actor,
        "payment_ref": change.payment_ref,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.credit_grant, params).fetchone()
    if row is None:
        raise UntranslatableEvent(
            f"account {account.id!r} has no counter of {pack.metric!r} yet; replay once the account is read"
        )
    said = "granted" if row["created"] else "already granted"
    return Outcome(
        status="applied",
        account_id=account.id,
        customer_id=change.customer_id,
        note=f"{said} {units} {pack.metric} ({pack.name} x {change.quantity}): grant {row['grant_id']}",
    )


def _purchased(
    conn: Connection, provider: str, change: CreditRefund, *, account_id: str | None
) -> dict[str, object] | None:
    """The grant the refunded purchase made (credit_purchased, read as the owner: on Citus the
    account's lock and void are the owner's), of any account (`account_id` None) or of that one."""
    params = {
        "provider": provider,
        "payment_ref": change.payment_ref,
        "reference": change.reference,
        "account_id": account_id,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q.credit_purchased, params).fetchone()


def _credit_refund(
    conn: Connection, env: Envelope, change: CreditRefund, account: LockedAccount | None, *, actor: str
) -> Outcome:
    """Void the refunded share of the purchase's grant, forward-only: a running total refunded of
    `amount`, rounded up in units, less what was voided already; all of it (what is left) for a
    whole refund. What takes drew stays drawn, so a balance never goes negative."""
    bought = None if account is None else _purchased(conn, env.provider, change, account_id=account.id)
    if account is None or bought is None:
        return Outcome(status="ignored", note="no credit grant was bought by this payment or transaction")
    units: int | None = None  # the whole remainder
    if (
        change.amount is not None
        and change.amount_refunded is not None
        and change.amount_refunded < change.amount
    ):
        share = math.ceil(cast(int, bought["units"]) * change.amount_refunded / change.amount)
        units = share - cast(int, bought["voided"])
        if units <= 0:
            return Outcome(
                status="applied",
                account_id=account.id,
                note=f"grant {bought['grant_id']}: nothing more to void",
            )
    params = {"account_id": account.id, "grant_id": bought["grant_id"], "units": units, "actor": actor}
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.credit_void, params).fetchone()
    assert row is not None  # the grant was just found, under the account's lock
    return Outcome(
        status="applied",
        account_id=account.id,
        note=f"grant {bought['grant_id']}: {row['voided']} voided in all, {row['used']} already used",
    )


def deliver_params(
    plans: PlanConfig,
    env: Envelope,
    change: SubscriptionChange,
    *,
    actor: str,
    store: bool,
    locked: bool,
    account_id: str | None,
    resolved: bool,
) -> dict[str, object]:
    """billing_deliver's parameters: store (if `store`) and apply `change` for `account_id`.
    `resolved` says the caller found the account (find_account; None: unmatched); otherwise
    `account_id` is the first id the event names, and status UNRESOLVED answers that no such account
    exists (nothing written). `locked` says the caller holds the account's lock in a transaction, so
    a subscription may move here, and the caller then sets the previous owner's tier."""
    plan = plan_for(plans, change.plan_keys)
    note = None
    if plan is None and change.plan_keys != PlanKeys():
        note = f"{change.plan_keys.describe()} map to no plan in the plan config; plan unchanged"
    return {
        "provider": env.provider,
        "event_id": env.event_id,
        "type": env.type,
        "occurred_at": env.occurred_at,
        "payload": env.body,
        "account_ids": array_literal(change.account_ids),  # a str: psycopg adapts it at once
        "subscription_id": change.subscription_id,
        "customer_id": change.customer_id,
        "plan": plan,
        "status": change.status,
        "status_if_new": change.status_if_new,
        "final": change.final,
        "opens": change.opens,
        "expires_at": change.expires_at,
        "supersedes_temporary": change.supersedes_temporary,
        "note": note,
        "unmatched_note": unmatched_note(change.account_ids, change.customer_id),
        "actor": actor,
        "store": store,
        "locked": locked,
        "account_id": account_id,
        "resolved": resolved,
        **plans.limit_table,
    }


def billing_deliver(conn: Connection, params: dict[str, object]) -> Outcome:
    """Run billing_deliver with `params` (deliver_params). Raises psycopg's SerializationFailure
    when it cannot decide alone (a subscription moving from another account without `locked`, a
    copy stored meanwhile: see the function)."""
    with psycopg.RawCursor(conn) as cur:
        row = _DELIVER.execute(cur, params).fetchone()
    assert row is not None  # the statement always answers one row
    # A plain tuple: class_row would read the column names again on every execute.
    got = cast(tuple[int | None, str, str | None, str | None, str | None, int | None, bool | None], row)
    return Outcome(
        inbox_id=got[0],
        status=got[1],
        note=got[2],
        account_id=got[3],
        moved_from=got[4],
        waiting=bool(got[6]),
    )


def deliver_subscription(
    conn: Connection, plans: PlanConfig, env: Envelope, change: SubscriptionChange, *, actor: str
) -> Outcome:
    """The common case, in autocommit: store and apply a subscription event in one statement for the
    account it names first (one round trip), else for the account find_account picks (two). Raises
    SerializationFailure (or DeadlockDetected) when it gave way and rolled back whole: the caller
    then takes the locked path."""

    def deliver(account_id: str | None, *, resolved: bool) -> Outcome:
        params = deliver_params(
            plans,
            env,
            change,
            actor=actor,
            store=True,
            locked=False,
            account_id=account_id,
            resolved=resolved,
        )
        return billing_deliver(conn, params)

    done = deliver(change.account_ids[0], resolved=False) if change.account_ids else None
    if done is None or done.status == UNRESOLVED:
        done = deliver(find_account(conn, env.provider, account_keys(change)), resolved=True)
    return done


def _subscription(
    conn: Connection,
    plans: PlanConfig,
    env: Envelope,
    change: SubscriptionChange,
    account: LockedAccount | None,
    *,
    actor: str,
) -> Outcome:
    """billing_deliver on the locked path (the row is the caller's): a subscription may move here,
    and its previous owner then follows its remaining subscriptions."""
    params = deliver_params(
        plans,
        env,
        change,
        actor=actor,
        store=False,
        locked=True,
        account_id=account.id if account else None,
        resolved=True,
    )
    done = billing_deliver(conn, params)
    if done.moved_from is not None:
        set_tier(conn, plans, lock_accounts(conn, [done.moved_from]), actor=actor)
    return replace(done, subscription_id=change.subscription_id, customer_id=change.customer_id)


def _link(conn: Connection, env: Envelope, change: CustomerLink, account: LockedAccount | None) -> Outcome:
    if account is None:
        if not change.account_ids and not change.subscription_id:
            return Outcome(
                status="ignored",
                customer_id=change.customer_id,
                note=f"names no account or subscription, and customer {change.customer_id!r} is not "
                "linked to an account",
            )
        return Outcome(
            status="unmatched",
            subscription_id=change.subscription_id,
            customer_id=change.customer_id,
            note=unmatched_note(change.account_ids, change.customer_id, change.subscription_id),
        )
    params = {
        "provider": env.provider,
        "customer_id": change.customer_id,
        "account_id": account.id,
        "event_id": env.event_id,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.billing_link_customer, params).fetchone()
    assert row is not None  # the function answers the link, new or existing
    linked_to, created = str(row["linked_to"]), bool(row["created"])
    if linked_to != account.id:
        note = f"customer {change.customer_id!r} stays linked to account {linked_to!r}"
    elif created:
        note = f"linked customer {change.customer_id!r} to account {account.id!r}"
    else:
        note = f"customer {change.customer_id!r} was linked to account {account.id!r} already"
    return Outcome(
        status="applied",
        account_id=account.id,
        subscription_id=change.subscription_id,
        customer_id=change.customer_id,
        note=note,
        waiting=True,  # the link may let stored events find their account
    )


def _transfer(
    conn: Connection,
    plans: PlanConfig,
    env: Envelope,
    change: Transfer,
    target: LockedAccount | None,
    *,
    actor: str,
) -> Outcome:
    if target is None:
        return Outcome(status="unmatched", note=unmatched_note(change.to_ids, None))
    sources = lock_accounts(conn, set(change.from_ids) - {target.id})
    params = {
        "provider": env.provider,
        "from_ids": list(change.from_ids),
        "account_id": target.id,
        "event_at": env.occurred_at,
        "event_id": env.event_id,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        moved = cur.execute(Q.subscriptions_transfer, params).fetchall()
    if not moved:
        return Outcome(
            status="applied",
            account_id=target.id,
            note=f"no stored subscription of {list(change.from_ids)} to move; "
            "the destination's tier follows its next event",
        )
    left = {str(r["prior_account_id"]) for r in moved}
    set_tier(
        conn, plans, sorted([target, *(a for a in sources if a.id in left)], key=lambda a: a.id), actor=actor
    )
    subs = ", ".join(str(r["subscription_id"]) for r in moved)
    return Outcome(
        status="applied",
        account_id=target.id,
        subscription_id=str(moved[0]["subscription_id"]) if len(moved) == 1 else None,
        note=f"moved {subs} from {sorted(left)}",
    )


def unmatched_note(
    account_ids: tuple[str, ...], customer_id: str | None, subscription_id: str | None = None
) -> str:
    """Why an event found no account, and what will apply it."""
    named = ", ".join(repr(a) for a in account_ids) or "no account id"
    tail = f" and customer {customer_id!r} is not linked" if customer_id else ""
    if subscription_id:
        tail += f", subscription {subscription_id!r} is not known"
    return (
        f"no known account: the event names {named}{tail}; it is applied when the account is "
        "created or linked"
    )

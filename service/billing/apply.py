"""Apply a provider-neutral billing change to our state: subscriptions, customer links, and the
account's plan tier and subscription status, which follow its subscriptions.

Only tier and status change on an account (through `accounts.apply_plan`, or billing_deliver,
which does the same in the database); no usage counter, ledger row or override is touched here.
Everything runs in the caller's transaction.

Concurrency: a subscription event is one statement, a call of the PL/pgSQL function billing_deliver
(migrations/repeatable/billing_rules.sql), which locks the account first and then decides its tier
and status from all its subscriptions, each of its statements with a fresh snapshot: every
transaction that changes an account's subscriptions holds the account's row lock, so a concurrent
delivery waits for it and then sees its change. Only a subscription that moves from another account
(and a copy of the event stored meanwhile for another account) makes it give way: the delivery runs
again in a transaction that locks the account (resolve_account), as replays and the rarer paths do
(a transfer), and the previous owner is then locked and recomputed; a deadlock there is retried by
the inbox.

One shard per account (Citus, README "Scaling out"): the account is found first, by a read of the
billing tables (find_account_for; skipped when the event names an existing account), and every
statement that reads or writes an account's tables then names it. Several accounts are locked one
statement each, in id order, never by one statement across shards.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import psycopg
from psycopg.rows import class_row, dict_row

from service.billing.events import (
    Change,
    CustomerLink,
    Envelope,
    NoChange,
    PlanKeys,
    SubscriptionChange,
    Transfer,
)
from service.billing.plans import PlanConfig, array_literal
from service.db import Connection, Positional, Q
from service.quota.accounts import apply_plan

_DELIVERY = Positional.of(Q.billing_deliver)

# An account whose last subscription moved away (RevenueCat TRANSFER) keeps its tier as the provider
# last said, with this status: it has no access any more, like an expired subscription.
NO_SUBSCRIPTION_STATUS = "expired"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What applying one event did; becomes the inbox row's status and columns."""

    status: str  # applied | ignored | unmatched | failed
    account_id: str | None = None
    subscription_id: str | None = None
    customer_id: str | None = None
    note: str | None = None
    error: str | None = None


def plan_for(plans: PlanConfig, keys: PlanKeys) -> str | None:
    """The plan these provider keys map to in the plan config, or None."""
    if keys.stripe_prices:
        return plans.plan_for_stripe_price(*keys.stripe_prices)
    if keys.revenuecat_entitlements or keys.revenuecat_product:
        return plans.plan_for_revenuecat(list(keys.revenuecat_entitlements), keys.revenuecat_product)
    return None


@dataclass(frozen=True, kw_only=True)
class Lookup:
    """What names the account a change is for (see the billing_account statement)."""

    account_ids: tuple[str, ...]
    subscription_id: str | None = None
    customer_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """The account a change is for, locked until commit, with its tier and status."""

    id: str
    plan: str
    subscription_status: str


def lookup(change: SubscriptionChange | CustomerLink | Transfer) -> Lookup:
    """How to find the account `change` is for."""
    match change:
        case SubscriptionChange():
            return Lookup(
                account_ids=change.account_ids,
                subscription_id=change.subscription_id,
                customer_id=change.customer_id,
            )
        case CustomerLink():
            return Lookup(
                account_ids=change.account_ids,
                subscription_id=change.subscription_id,
                customer_id=change.customer_id,
            )
        case Transfer():
            return Lookup(account_ids=change.to_ids)


def lookup_params(provider: str, keys: Lookup) -> dict[str, object]:
    return {
        "provider": provider,
        "account_ids": list(keys.account_ids),
        "subscription_id": keys.subscription_id,
        "customer_id": keys.customer_id,
    }


def find_account_for(conn: Connection, provider: str, keys: Lookup) -> str | None:
    """The id of the first existing account `keys` name (the ids in order, the subscription's owner,
    the customer's linked account, product link first), read without a lock; None: unmatched."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.billing_account, lookup_params(provider, keys)).fetchone()
    return None if row is None else str(row["account_id"])


def resolve_account(conn: Connection, provider: str, keys: Lookup) -> Resolved | None:
    """The account `keys` name (find_account_for), locked until commit and its billing_version
    bumped. None: unmatched. Never creates an account. Found, then locked by its id: two
    statements, so that on Citus the lock is on the account's shard alone. What a delivery does next
    under the lock sees every change committed before, and a subscription that moved meanwhile is
    caught by billing_deliver itself."""
    account_id = find_account_for(conn, provider, keys)
    if account_id is None:
        return None
    return lock_account(conn, account_id)


def lock_account(conn: Connection, account_id: str) -> Resolved | None:
    """Lock one account for a billing change (account_lock); None: no such account."""
    with conn.cursor(row_factory=class_row(Resolved)) as cur:
        return cur.execute(Q.account_lock, {"account_id": account_id}).fetchone()


def apply_change(
    conn: Connection,
    plans: PlanConfig,
    env: Envelope,
    change: Change,
    account: Resolved | None,
    *,
    actor: str,
) -> Outcome:
    """Apply `change` (translated from `env`) for `account`, which the caller resolved from
    `lookup(change)` and locked; say what happened."""
    match change:
        case NoChange(reason=reason):
            return Outcome(status="ignored", note=reason)
        case SubscriptionChange():
            return _subscription(conn, plans, env, change, account, actor=actor)
        case CustomerLink():
            return _link(conn, env, change, account)
        case Transfer():
            return _transfer(conn, plans, env, change, account, actor=actor)


@dataclass(frozen=True, kw_only=True)
class Delivered:
    """What billing_deliver did: the inbox row (None: a duplicate, or not stored, a replay),
    the event's status and note, its account, the account a subscription moved from, and whether
    stored unmatched events may now apply (`waiting`: see inbox.apply_waiting)."""

    inbox_id: int | None
    status: str
    note: str | None
    account_id: str | None
    moved_from: str | None
    waiting: bool = False


# What billing_deliver answers when the account it was given as the event's first named id
# does not exist: nothing was written or stored; find the account (find_account_for) and run again.
UNRESOLVED = "unresolved"


def delivery_params(
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
    `resolved` says the caller found the account (find_account_for; None: unmatched); otherwise
    `account_id` is the first id the event names, and status UNRESOLVED answers that no such account
    exists (nothing written). `locked` says the caller holds the account's lock in a transaction
    (resolve_account), so a subscription may move here, and the caller then recomputes
    `moved_from`."""
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
        "unmatched_note": _unmatched_note(change.account_ids, change.customer_id),
        "actor": actor,
        "store": store,
        "locked": locked,
        "account_id": account_id,
        "resolved": resolved,
        **plans.limit_table,
    }


def deliver_subscription(conn: Connection, params: dict[str, object]) -> Delivered:
    """Run billing_deliver with `params` (delivery_params): store and apply the change in one
    statement. Raises psycopg's SerializationFailure when it cannot decide alone (a subscription
    moving from another account without `locked`, a copy stored meanwhile: see the function)."""
    with psycopg.RawCursor(conn) as cur:
        row = _DELIVERY.execute(cur, params).fetchone()
    assert row is not None  # the statement always answers one row
    # A plain tuple: class_row would read the column names again on every execute. limit_changes is
    # not needed here.
    got = cast(tuple[int | None, str, str | None, str | None, str | None, int | None, bool | None], row)
    return Delivered(
        inbox_id=got[0],
        status=got[1],
        note=got[2],
        account_id=got[3],
        moved_from=got[4],
        waiting=bool(got[6]),
    )


def deliver_subscription_locked(
    conn: Connection,
    plans: PlanConfig,
    env: Envelope,
    change: SubscriptionChange,
    account: Resolved | None,
    *,
    actor: str,
    store: bool,
) -> Delivered:
    """billing_deliver for a caller that holds `account`'s lock (resolve_account; None:
    unmatched): a subscription may move here, and its previous owner's tier and status are then
    recomputed."""
    params = delivery_params(
        plans,
        env,
        change,
        actor=actor,
        store=store,
        locked=True,
        account_id=account.id if account else None,
        resolved=True,
    )
    done = deliver_subscription(conn, params)
    if done.moved_from is not None:
        follow_subscriptions(conn, plans, {done.moved_from}, actor=actor)
    return done


def _subscription(
    conn: Connection,
    plans: PlanConfig,
    env: Envelope,
    change: SubscriptionChange,
    account: Resolved | None,
    *,
    actor: str,
) -> Outcome:
    """A replay: the caller holds the account's lock and the stored row."""
    done = deliver_subscription_locked(conn, plans, env, change, account, actor=actor, store=False)
    return Outcome(
        status=done.status,
        account_id=done.account_id,
        subscription_id=change.subscription_id,
        customer_id=change.customer_id,
        note=done.note,
    )


def _link(conn: Connection, env: Envelope, change: CustomerLink, account: Resolved | None) -> Outcome:
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
            note=_unmatched_note(change.account_ids, change.customer_id, change.subscription_id),
        )
    params = {
        "provider": env.provider,
        "customer_id": change.customer_id,
        "account_id": account.id,
        "event_id": env.event_id,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.customer_link, params).fetchone()
    assert row is not None  # the statement answers the link, new or existing
    linked_to, created = str(row["account_id"]), bool(row["created"])
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
    )


def _transfer(
    conn: Connection,
    plans: PlanConfig,
    env: Envelope,
    change: Transfer,
    target: Resolved | None,
    *,
    actor: str,
) -> Outcome:
    if target is None:
        return Outcome(status="unmatched", note=_unmatched_note(change.to_ids, None))
    lock_accounts(conn, set(change.from_ids) - {target.id})
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
    sources = {str(r["prior_account_id"]) for r in moved}
    follow_subscriptions(conn, plans, {target.id, *sources}, actor=actor)
    subs = ", ".join(str(r["subscription_id"]) for r in moved)
    return Outcome(
        status="applied",
        account_id=target.id,
        subscription_id=str(moved[0]["subscription_id"]) if len(moved) == 1 else None,
        note=f"moved {subs} from {sorted(sources)}",
    )


def follow_subscriptions(conn: Connection, plans: PlanConfig, account_ids: set[str], *, actor: str) -> None:
    """Set each account's tier and status from its deciding subscription (an active one wins over
    ended ones), through `apply_plan`, where they differ. Locks the accounts first (id order)."""
    ids = sorted(account_ids)
    accounts = lock_accounts(conn, ids)
    with conn.cursor(row_factory=dict_row) as cur:
        best = {r["account_id"]: r for r in cur.execute(Q.accounts_best_subscription, {"account_ids": ids})}
    for account in accounts:
        sub = best.get(account.id)
        new_plan = str((sub and sub["plan"]) or account.plan)
        new_status = str(sub["status"]) if sub else NO_SUBSCRIPTION_STATUS
        if (new_plan, new_status) != (account.plan, account.subscription_status):
            apply_plan(conn, plans, account_id=account.id, plan=new_plan, status=new_status, actor=actor)


def lock_accounts(conn: Connection, account_ids: Iterable[str]) -> list[Resolved]:
    """Lock these accounts for a billing change, in id order, as resolve_account locks one (a
    concurrent delivery for one of them waits); returns those that exist. One statement per
    account, each on its account's shard on Citus: the id order keeps two callers from
    deadlocking, as one statement's ORDER BY did. (Several accounts are rare: a
    transfer and the owner a subscription moved from.)"""
    locked = (lock_account(conn, account_id) for account_id in sorted(set(account_ids)))
    return [account for account in locked if account is not None]


def _unmatched_note(
    account_ids: tuple[str, ...], customer_id: str | None, subscription_id: str | None = None
) -> str:
    named = ", ".join(repr(a) for a in account_ids) or "no account id"
    tail = f" and customer {customer_id!r} is not linked" if customer_id else ""
    if subscription_id:
        tail += f", subscription {subscription_id!r} is not known"
    return (
        f"no known account: the event names {named}{tail}; it is applied when the account is "
        "created or linked"
    )

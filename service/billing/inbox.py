"""The webhook inbox: every verified provider event, stored once, with what became of it.

`receive` is the pipeline after verification, in a fixed order: allowlist, dedupe, persist, apply,
in one short transaction. Dedupe is the unique (provider, event_id) constraint with
`INSERT ... ON CONFLICT DO NOTHING RETURNING`, never a lookup, so concurrent copies of one delivery
store and apply it once.

A subscription event, the common case, is one statement in autocommit (a call of billing_deliver,
migrations/repeatable/billing_rules.sql: lock the account, store, order, apply, and the commit, in
one round trip), for the account the event names first. When the event names no account that
exists (an event found by its subscription or customer), a read of the billing tables finds the
account first (find_account_for), and the function runs for it: two round trips. The function locks
its account before it reads the account's subscriptions, so a concurrent change to the account is
waited for, not given way to, and each of its statements names the account, so that on Citus it
runs on the account's shard (README "Scaling out"). When it cannot decide alone (a subscription
moving from another account, which it has not locked; a copy of the event stored meanwhile for
another account) it rolls back whole, and the delivery runs again on the locked path: a transaction
that locks the account, runs the same function, then locks and recomputes the subscription's
previous owner. Customer links and transfers always take a transaction: lock the account, store the
row, apply, correct the row.

Only the conflicts the function is designed to give way on (serialization failures it raises
itself, and deadlocks) send a delivery to the locked path; any other error there is logged at
ERROR and the event stored `failed`, like a failure on the locked path.

Provider times are checked against the time of receipt: an event dated more than MAX_FUTURE after
it arrived is stored `ignored` with a note and never takes part in the ordering, since a time in the
future would make every real event after it look older (RevenueCat's own TRANSFER sample is dated
in the year 4466). A replay checks it against the stored receipt time.

Stored `unmatched` events wait for their account: when an account is created or a customer,
subscription or RevenueCat alias is linked to one, `apply_waiting` replays the events that the new
link makes applicable, in provider order.

Failure handling: a verified event is always stored. If applying it fails (its contents cannot be
read, or a bug), the transaction is rolled back and the row is then stored alone as `failed` with
the error, and the provider gets a 200: a retry would only be a duplicate of a stored row, so an
admin replays it once the cause is fixed. (Rolling back and storing again costs nothing on the
normal path, where a savepoint around every apply would cost two round trips.) Only when the row
itself cannot be stored (the database is unreachable) does the request fail (503), so that the
provider retries the delivery.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TypeVar

import psycopg
from psycopg.rows import class_row, dict_row

from service import audit
from service.billing.apply import (
    UNRESOLVED,
    Delivered,
    Outcome,
    apply_change,
    deliver_subscription,
    deliver_subscription_locked,
    delivery_params,
    find_account_for,
    lookup,
    lookup_params,
    resolve_account,
)
from service.billing.events import Change, CustomerLink, Envelope, NoChange, SubscriptionChange, Transfer
from service.billing.plans import PlanConfig
from service.db import Connection, Q, transaction
from service.errors import QuotaError, UnknownEvent

log = logging.getLogger(__name__)

Translate = Callable[[Envelope], Change]
T = TypeVar("T")
RETRIES = 3  # deadlocks and serialization failures are retried within the request
# psycopg raises these as OperationalError subclasses, not as its TransactionRollback (SQLSTATE 40000).
RETRYABLE = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
# How far in the future of its receipt a provider's event time may be (clock skew) and still order.
MAX_FUTURE = timedelta(hours=1)
LINK_ACTOR = "link"


@dataclass(frozen=True, kw_only=True)
class Receipt:
    """The answer to a delivery: the inbox row, its status, whether it was a duplicate, and
    whether it took the locked path (a transaction that locks the account first) because the
    one-statement delivery gave way (a subscription moving between accounts) or does not apply
    (customer links, transfers)."""

    id: int | None
    status: str
    duplicate: bool = False
    locked: bool = False
    waiting: bool = False  # stored unmatched events may apply now (see apply_waiting)


@dataclass(frozen=True, kw_only=True)
class StoredEvent:
    """An inbox row as support sees it (the payload stays in the database)."""

    id: int
    provider: str
    event_id: str
    type: str
    status: str
    error: str | None
    note: str | None
    account_id: str | None
    subscription_id: str | None
    customer_id: str | None
    occurred_at: datetime
    received_at: datetime
    processed_at: datetime | None
    attempts: int


class _ApplyFailed(Exception):
    """Applying the event failed; its transaction was rolled back."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


def receive(
    conn: Connection, plans: PlanConfig, env: Envelope, *, allowed: bool, translate: Translate
) -> Receipt:
    """Store and apply one verified delivery. Types outside the allowlist are stored as ignored.
    Then apply the stored unmatched events that it made applicable."""
    receipt = _receive(conn, plans, env, allowed=allowed, translate=translate)
    if receipt.waiting and not receipt.duplicate:
        try:
            apply_waiting(
                conn,
                plans,
                provider=env.provider,
                change=translate(env),
                translate_for=lambda _provider: translate,
            )
        except psycopg.OperationalError:
            raise
        except Exception:  # the delivery itself is stored and answered; the rest can be replayed
            log.exception("%s event %s: applying the waiting events failed", env.provider, env.event_id)
    return replace(receipt, waiting=False)


def _receive(
    conn: Connection, plans: PlanConfig, env: Envelope, *, allowed: bool, translate: Translate
) -> Receipt:
    if not allowed:
        return _store(conn, env, status="ignored", note="event type not handled")
    if future := _future_note(env, datetime.now(UTC)):
        return _store(conn, env, status="ignored", note=future)
    try:
        change = _guarded(env, lambda: translate(env))
    except _ApplyFailed as e:
        return _store(conn, env, status="failed", error=e.error)
    if isinstance(change, NoChange):  # nothing to apply: the row alone, in one statement
        return _store(conn, env, status="ignored", note=change.reason)
    actor = f"webhook:{env.provider}:{env.event_id}"
    if isinstance(change, SubscriptionChange):
        done = _in_one_statement(conn, plans, env, change, actor=actor)
        if done is not None:
            return done
    for attempt in range(1, RETRIES + 1):
        try:
            with transaction(conn):
                if isinstance(change, SubscriptionChange):
                    receipt = _subscription_locked(conn, plans, env, change, actor=actor)
                else:
                    receipt = _other_locked(conn, plans, env, change, actor=actor)
            return replace(receipt, locked=True)
        except _ApplyFailed as e:
            # Rolled back, change and row alike: store the row alone, as failed.
            return _store(conn, env, status="failed", error=e.error)
        except RETRYABLE as e:
            if attempt == RETRIES:
                raise
            log.warning("retrying %s event %s after %s", env.provider, env.event_id, type(e).__name__)
    raise AssertionError("unreachable")  # pragma: no cover


def _in_one_statement(
    conn: Connection, plans: PlanConfig, env: Envelope, change: SubscriptionChange, *, actor: str
) -> Receipt | None:
    """The common case, a subscription event, as one statement in autocommit: store, apply, commit
    in one round trip (two when the event names no existing account: see the module). None: it gave
    way (a subscription moving between accounts, a copy stored meanwhile for another account) or
    deadlocked, and rolled back whole; the caller takes the locked path."""

    def deliver(account_id: str | None, *, resolved: bool) -> Delivered:
        params = delivery_params(
            plans,
            env,
            change,
            actor=actor,
            store=True,
            locked=False,
            account_id=account_id,
            resolved=resolved,
        )
        return deliver_subscription(conn, params)

    try:
        done = deliver(change.account_ids[0], resolved=False) if change.account_ids else None
        if done is None or done.status == UNRESOLVED:
            done = deliver(find_account_for(conn, env.provider, lookup(change)), resolved=True)
    except RETRYABLE:
        return None  # the designed way out: the function gave way (or deadlocked)
    except psycopg.OperationalError:
        raise  # the database is unreachable: nothing stored, the provider retries
    except psycopg.DataError:
        raise  # something in the body the database cannot store: answered 400, nothing stored
    except Exception as e:
        log.exception("%s event %s failed", env.provider, env.event_id)
        return _store(conn, env, status="failed", error=f"{type(e).__name__}: {e}")
    if done.inbox_id is None:
        return _duplicate(conn, env)
    return Receipt(id=done.inbox_id, status=done.status, waiting=done.waiting)


def _subscription_locked(
    conn: Connection, plans: PlanConfig, env: Envelope, change: SubscriptionChange, *, actor: str
) -> Receipt:
    """A subscription event with its account locked before the statement reads its subscriptions."""
    account = resolve_account(conn, env.provider, lookup(change))
    done = _guarded(
        env, partial(deliver_subscription_locked, conn, plans, env, change, account, actor=actor, store=True)
    )
    if done.inbox_id is None:
        return _duplicate(conn, env)
    return Receipt(id=done.inbox_id, status=done.status, waiting=done.waiting)


def _other_locked(
    conn: Connection, plans: PlanConfig, env: Envelope, change: CustomerLink | Transfer, *, actor: str
) -> Receipt:
    """A customer link or a transfer: lock its account (resolved first), store the row as applied
    to it (or unmatched), apply, and correct the row if the outcome differs."""
    keys = lookup(change)
    account = resolve_account(conn, env.provider, keys)
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            Q.inbox_insert_resolved,
            {
                **lookup_params(env.provider, keys),
                **_row_params(env),
                "account_id": account.id if account else None,
            },
        ).fetchone()
    if row is None:
        return _duplicate(conn, env)
    inbox_id = int(row["id"])
    stored = Outcome(
        status="applied" if account else "unmatched",
        account_id=account.id if account else None,
        subscription_id=keys.subscription_id,
        customer_id=keys.customer_id,
    )
    outcome = _guarded(env, partial(apply_change, conn, plans, env, change, account, actor=actor))
    if outcome != stored:
        _finish(conn, inbox_id, outcome, replay=False, named=keys.account_ids)
    # A new link may let stored events find their account; a transfer moves what exists.
    return Receipt(
        id=inbox_id,
        status=outcome.status,
        waiting=isinstance(change, CustomerLink) and outcome.status == "applied",
    )


def replay(
    conn: Connection,
    plans: PlanConfig,
    inbox_id: int,
    *,
    translate_for: Callable[[str], Translate],
    actor: str,
) -> StoredEvent:
    """Apply a stored event again (e.g. once its account exists). The ordering rules hold as for a
    delivery: an event older than a subscription's stored state changes nothing."""
    for attempt in range(1, RETRIES + 1):
        try:
            with transaction(conn):
                with conn.cursor(row_factory=dict_row) as cur:
                    row = cur.execute(Q.inbox_for_replay, {"id": inbox_id}).fetchone()
                if row is None:
                    raise UnknownEvent(f"no stored webhook event has id {inbox_id}")
                env = Envelope(
                    provider=row["provider"],
                    event_id=row["event_id"],
                    type=row["type"],
                    occurred_at=row["occurred_at"],
                    body=json.dumps(row["payload"]),
                    data=row["payload"],
                )
                by = f"replay:{actor}:{env.provider}:{env.event_id}"
                received: datetime = row["received_at"]

                def run(env: Envelope = env, by: str = by, received: datetime = received) -> Outcome:
                    if future := _future_note(env, received):
                        return Outcome(status="ignored", note=future)
                    change = translate_for(env.provider)(env)
                    account = None
                    if not isinstance(change, NoChange):
                        account = resolve_account(conn, env.provider, lookup(change))
                    return apply_change(conn, plans, env, change, account, actor=by)

                outcome = _guarded(env, run)
                _finish(conn, inbox_id, outcome, replay=True)
                _audit_replay(
                    conn,
                    inbox_id,
                    env,
                    actor=actor,
                    status=outcome.status,
                    account_id=outcome.account_id,
                    error=outcome.error,
                )
            break
        except _ApplyFailed as e:
            with transaction(conn):
                conn.execute(Q.inbox_failed, {"id": inbox_id, "error": e.error})
                _audit_replay(
                    conn, inbox_id, env, actor=actor, status="failed", account_id=None, error=e.error
                )
            break
        except RETRYABLE:
            if attempt == RETRIES:
                raise
    return get(conn, inbox_id)


def _audit_replay(
    conn: Connection,
    inbox_id: int,
    env: Envelope,
    *,
    actor: str,
    status: str,
    account_id: str | None,
    error: str | None,
) -> None:
    """An admin's replay is an admin action: one audit row, with what became of the event."""
    audit.record(
        conn,
        actor=actor,
        action="event_replayed",
        account_id=account_id or "",
        old=None,
        new={
            "inbox_id": inbox_id,
            "provider": env.provider,
            "event_id": env.event_id,
            "type": env.type,
            "status": status,
            "error": error,
        },
    )


def apply_waiting(
    conn: Connection,
    plans: PlanConfig,
    *,
    provider: str | None = None,
    change: Change | None = None,
    account_ids: tuple[str, ...] = (),
    customer_id: str | None = None,
    translate_for: Callable[[str], Translate],
) -> list[StoredEvent]:
    """Replay, in provider order, the stored unmatched events that a new link may make applicable:
    those of `change`'s subscription or customer or naming its accounts (after a delivery), or
    naming `account_ids` or `customer_id` (an account created or given a customer). Each replay is
    its own transaction; one that still finds no account stays unmatched. Needs a connection in no
    transaction."""
    subscription_id = None
    if isinstance(change, SubscriptionChange | CustomerLink):
        account_ids = (*account_ids, *change.account_ids)
        customer_id = customer_id or change.customer_id
        subscription_id = change.subscription_id
    params = {
        "provider": provider,
        "subscription_id": subscription_id,
        "customer_id": customer_id,
        "account_ids": list(account_ids),
    }
    with conn.cursor(row_factory=dict_row) as cur:
        waiting = [int(r["id"]) for r in cur.execute(Q.inbox_waiting, params).fetchall()]
    return [
        replay(conn, plans, inbox_id, translate_for=translate_for, actor=LINK_ACTOR) for inbox_id in waiting
    ]


def _future_note(env: Envelope, received: datetime) -> str | None:
    """Why `env` must not take part in the ordering: its provider time is too far in the future of
    its receipt. None: it is fine."""
    if env.occurred_at <= received + MAX_FUTURE:
        return None
    return (
        f"provider time {env.occurred_at.isoformat()} is more than {MAX_FUTURE} after the event was "
        f"received ({received.isoformat()}); not applied, so that it cannot outrank later events"
    )


def get(conn: Connection, inbox_id: int) -> StoredEvent:
    with conn.cursor(row_factory=class_row(StoredEvent)) as cur:
        found = cur.execute(Q.inbox_get, {"id": inbox_id}).fetchone()
    if found is None:
        raise UnknownEvent(f"no stored webhook event has id {inbox_id}")
    return found


def page(
    conn: Connection,
    *,
    after: int = 0,
    limit: int = 100,
    status: str | None = None,
    provider: str | None = None,
) -> list[StoredEvent]:
    """Inbox rows with id > `after`, oldest first, at most `limit`."""
    with conn.cursor(row_factory=class_row(StoredEvent)) as cur:
        return cur.execute(
            Q.inbox_page, {"after": after, "limit": limit, "status": status, "provider": provider}
        ).fetchall()


def _row_params(env: Envelope) -> dict[str, object]:
    return {
        "provider": env.provider,
        "event_id": env.event_id,
        "type": env.type,
        "occurred_at": env.occurred_at,
        "payload": env.body,
    }


def _store(
    conn: Connection, env: Envelope, *, status: str, note: str | None = None, error: str | None = None
) -> Receipt:
    """Dedupe and store the row with its final status in one statement (nothing to apply)."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            Q.inbox_insert, {**_row_params(env), "status": status, "note": note, "error": error}
        ).fetchone()
    if row is None:
        return _duplicate(conn, env)
    return Receipt(id=int(row["id"]), status=status)


def _duplicate(conn: Connection, env: Envelope) -> Receipt:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.inbox_status, {"provider": env.provider, "event_id": env.event_id}).fetchone()
    if row is None:  # pragma: no cover - the conflicting row was committed before we looked
        return Receipt(id=None, status="duplicate", duplicate=True)
    return Receipt(id=int(row["id"]), status=str(row["status"]), duplicate=True)


def _guarded(env: Envelope, work: Callable[[], T]) -> T:
    """Run translation or application; a failure becomes _ApplyFailed, which rolls the caller's
    transaction back. Errors of the connection itself propagate (nothing can be stored: the
    provider retries), deadlocks included (retried by the caller)."""
    try:
        return work()
    except psycopg.OperationalError:
        raise
    except QuotaError as e:
        log.warning("%s event %s failed: %s", env.provider, env.event_id, e.message)
        raise _ApplyFailed(e.message) from e
    except Exception as e:
        log.exception("%s event %s failed", env.provider, env.event_id)
        raise _ApplyFailed(f"{type(e).__name__}: {e}") from e


def _finish(
    conn: Connection, inbox_id: int, outcome: Outcome, *, replay: bool, named: tuple[str, ...] = ()
) -> None:
    conn.execute(
        Q.inbox_finish,
        {
            "named_accounts": list(named) if named else None,
            "id": inbox_id,
            "status": outcome.status,
            "error": outcome.error,
            "note": outcome.note,
            "account_id": outcome.account_id,
            "subscription_id": outcome.subscription_id,
            "customer_id": outcome.customer_id,
            "replay": 1 if replay else 0,
        },
    )

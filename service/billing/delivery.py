"""The webhook delivery pipeline, after the adapter verified a delivery: allowlist, then dedupe and
store, resolve the account, apply, finish the row, each once and in that order (`receive`); replays
of stored events run the same resolve, apply and finish (`replay`).

A subscription event, the common case, takes all of it in one statement in autocommit (a call of
billing_deliver, migrations/repeatable/billing_rules.sql: lock the account, dedupe, store, order,
apply, commit, in one round trip). When that statement cannot decide alone (a subscription moving
from another account, a copy stored meanwhile) it rolls back whole and gives way to the locked
path, which customer links and transfers always take: one transaction that stores the row (the
dedupe), locks the account, applies and finishes the row. Deadlocks and the designed serialization
failures are retried.

A verified event is always stored. If applying it fails (its contents cannot be read, or a bug),
its transaction rolls back and the row is stored alone as `failed` with the error, and the provider
gets a 200: a retry would only be a duplicate, so an admin replays it once the cause is fixed. Only
when the row itself cannot be stored (the database is unreachable) does the request fail (503), so
that the provider retries. An event dated more than MAX_FUTURE after its receipt is stored
`ignored`: a time in the future would make every real event after it look older. Stored
`unmatched` events wait for their account (`apply_waiting`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import psycopg

from service.billing import apply, inbox
from service.billing.apply import Outcome
from service.billing.events import Change, CustomerLink, Envelope, NoChange, SubscriptionChange
from service.db import Connection, transaction
from service.errors import QuotaError
from service.plans import PlanConfig

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
    """The answer to a delivery: the inbox row, its status, whether it was a duplicate, and whether
    it took the locked path (a transaction that locks the account first)."""

    id: int | None
    status: str
    duplicate: bool = False
    locked: bool = False


class _ApplyFailed(Exception):
    """Applying the event failed; its transaction was rolled back."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


def for_environment(
    translate: Translate, environment_of: Callable[[dict[str, Any]], str | None], wanted: str | None
) -> Translate:
    """The webhook-environment policy: with `wanted` set (WEBHOOK_ENVIRONMENT), an event of the other
    provider environment (or of none it names) changes nothing: it is stored as ignored, with a
    note, so that a sandbox purchase never upgrades a production account. A replay after the
    setting changes applies it."""
    if wanted is None:
        return translate

    def in_environment(env: Envelope) -> Change:
        got = environment_of(env.data)
        if got != wanted:
            return NoChange(
                reason=f"a {got or 'unknown-environment'} event; this deployment applies {wanted} "
                "events only (WEBHOOK_ENVIRONMENT)"
            )
        return translate(env)

    return in_environment


def receive(
    conn: Connection,
    plans: PlanConfig,
    env: Envelope,
    *,
    allowed: bool,
    translate: Translate,
    unmatched_limit: int | None = None,
) -> Receipt:
    """Store and apply one verified delivery (types outside the allowlist are stored as ignored),
    then apply the stored unmatched events it made applicable. An unmatched event beyond the
    provider's `unmatched_limit` removes the oldest (inbox.bound_unmatched). Needs an autocommit
    connection."""
    admitted = _admit(env, datetime.now(UTC), allowed=allowed, translate=translate)
    if isinstance(admitted, Outcome):  # nothing to apply: the row alone, in one statement
        receipt, waiting = _store_only(conn, env, admitted), False
    else:
        receipt, waiting = _deliver(conn, plans, env, admitted)
    if receipt.duplicate:
        return receipt
    try:
        if waiting and not isinstance(admitted, Outcome):
            apply_waiting(
                conn, plans, provider=env.provider, change=admitted, translate_for=lambda _provider: translate
            )
        if receipt.status == "unmatched" and unmatched_limit is not None:
            inbox.bound_unmatched(conn, env.provider, keep=unmatched_limit)
    except psycopg.OperationalError:
        raise
    except Exception:  # the delivery itself is stored and answered; the rest can be replayed
        log.exception("%s event %s: what follows the delivery failed", env.provider, env.event_id)
    return receipt


def _admit(env: Envelope, received: datetime, *, allowed: bool, translate: Translate) -> Change | Outcome:
    """The allowlist, the provider-time check and the translation: the change to apply, or the
    outcome of an event with nothing to apply (ignored, or failed when it cannot be read)."""
    if not allowed:
        return Outcome(status="ignored", note="event type not handled")
    if env.occurred_at > received + MAX_FUTURE:
        return Outcome(
            status="ignored",
            note=f"provider time {env.occurred_at.isoformat()} is more than {MAX_FUTURE} after the event "
            f"was received ({received.isoformat()}); not applied, so that it cannot outrank later events",
        )
    try:
        change = _guarded(env, lambda: translate(env))
    except _ApplyFailed as e:
        return Outcome(status="failed", error=e.error)
    if isinstance(change, NoChange):
        return Outcome(status="ignored", note=change.reason)
    return change


def _deliver(conn: Connection, plans: PlanConfig, env: Envelope, change: Change) -> tuple[Receipt, bool]:
    """Dedupe, store, resolve, apply and finish: in one statement when it can (a subscription
    event), else on the locked path. The receipt, and whether stored unmatched events may apply."""
    actor = f"webhook:{env.provider}:{env.event_id}"
    change = apply.credits_or(plans, change)
    if isinstance(change, SubscriptionChange):
        try:
            done = apply.deliver_subscription(conn, plans, env, change, actor=actor)
        except RETRYABLE:
            pass  # the designed way out: it gave way (or deadlocked) and rolled back; the locked path
        except (psycopg.OperationalError, psycopg.DataError):
            raise  # unreachable database (the provider retries), or a body it cannot store (400)
        except Exception as e:
            log.exception("%s event %s failed", env.provider, env.event_id)
            return _store_only(conn, env, Outcome(status="failed", error=f"{type(e).__name__}: {e}")), False
        else:
            if done.inbox_id is None:
                return _duplicate(conn, env), False
            return Receipt(id=done.inbox_id, status=done.status), done.waiting
    for attempt in range(1, RETRIES + 1):
        try:
            with transaction(conn):
                # Stored first: the unique index is the dedupe. The status is provisional; the
                # finish below writes the outcome in the same transaction.
                inbox_id = inbox.store(conn, env, status="applied")
                if inbox_id is None:
                    return _duplicate(conn, env), False
                outcome = _resolve_apply_finish(conn, plans, env, change, inbox_id, actor=actor, replay=False)
            return Receipt(id=inbox_id, status=outcome.status, locked=True), outcome.waiting
        except _ApplyFailed as e:  # rolled back, change and row alike: the row alone, as failed
            return _store_only(conn, env, Outcome(status="failed", error=e.error)), False
        except RETRYABLE as e:
            if attempt == RETRIES:
                raise
            log.warning("retrying %s event %s after %s", env.provider, env.event_id, type(e).__name__)
    raise AssertionError("unreachable")  # pragma: no cover


def _resolve_apply_finish(
    conn: Connection,
    plans: PlanConfig,
    env: Envelope,
    change: Change,
    inbox_id: int,
    *,
    actor: str,
    replay: bool,
) -> Outcome:
    """The stored event's account found and locked, the change applied, the row finished; in the
    caller's transaction."""
    account = _guarded(env, partial(apply.resolve, conn, env.provider, change))
    outcome = _guarded(env, partial(apply.apply_change, conn, plans, env, change, account, actor=actor))
    named = () if isinstance(change, NoChange) else apply.account_keys(change).account_ids
    _finish(conn, inbox_id, outcome, named=named, replay=replay)
    return outcome


def replay(
    conn: Connection,
    plans: PlanConfig,
    inbox_id: int,
    *,
    translate_for: Callable[[str], Translate],
    actor: str,
) -> inbox.StoredEvent:
    """Apply a stored event again (e.g. once its account exists), as an admin action (audited). The
    ordering rules hold as for a delivery: an event older than a subscription's stored state changes
    nothing."""
    for attempt in range(1, RETRIES + 1):
        try:
            with transaction(conn):
                env, received = inbox.for_replay(conn, inbox_id)
                by = f"replay:{actor}:{env.provider}:{env.event_id}"
                admitted = _admit(env, received, allowed=True, translate=translate_for(env.provider))
                if isinstance(admitted, Outcome):
                    _finish(conn, inbox_id, admitted, named=(), replay=True)
                else:
                    admitted = apply.credits_or(plans, admitted)
                    _resolve_apply_finish(conn, plans, env, admitted, inbox_id, actor=by, replay=True)
                inbox.audit_replay(conn, inbox_id, actor=actor)
            break
        except _ApplyFailed as e:
            with transaction(conn):
                inbox.mark_failed(conn, inbox_id, e.error)
                inbox.audit_replay(conn, inbox_id, actor=actor)
            break
        except RETRYABLE:
            if attempt == RETRIES:
                raise
    return inbox.get(conn, inbox_id)


def apply_waiting(
    conn: Connection,
    plans: PlanConfig,
    *,
    provider: str | None = None,
    change: Change | None = None,
    account_ids: tuple[str, ...] = (),
    customer_id: str | None = None,
    translate_for: Callable[[str], Translate],
) -> list[inbox.StoredEvent]:
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
    ids = inbox.waiting(
        conn,
        provider=provider,
        subscription_id=subscription_id,
        customer_id=customer_id,
        account_ids=account_ids,
    )
    return [replay(conn, plans, inbox_id, translate_for=translate_for, actor=LINK_ACTOR) for inbox_id in ids]


def _store_only(conn: Connection, env: Envelope, outcome: Outcome) -> Receipt:
    """An event with nothing to apply: dedupe and store it with its outcome, in one statement."""
    inbox_id = inbox.store(conn, env, status=outcome.status, note=outcome.note, error=outcome.error)
    if inbox_id is None:
        return _duplicate(conn, env)
    return Receipt(id=inbox_id, status=outcome.status)


def _duplicate(conn: Connection, env: Envelope) -> Receipt:
    stored = inbox.stored_status(conn, env)
    if stored is None:  # pragma: no cover - the conflicting row was committed before we looked
        return Receipt(id=None, status="duplicate", duplicate=True)
    return Receipt(id=stored[0], status=stored[1], duplicate=True)


def _finish(
    conn: Connection, inbox_id: int, outcome: Outcome, *, named: tuple[str, ...], replay: bool
) -> None:
    inbox.finish(
        conn,
        inbox_id,
        status=outcome.status,
        account_id=outcome.account_id,
        subscription_id=outcome.subscription_id,
        customer_id=outcome.customer_id,
        note=outcome.note,
        error=outcome.error,
        named=named,
        replay=replay,
    )


def _guarded(env: Envelope, work: Callable[[], T]) -> T:
    """Run translation, resolution or application; a failure becomes _ApplyFailed, which rolls the
    caller's transaction back. Errors of the connection itself propagate (nothing can be stored:
    the provider retries), deadlocks included (retried by the caller)."""
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

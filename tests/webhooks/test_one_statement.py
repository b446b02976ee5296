"""The one-statement delivery: a subscription event is applied by one statement in autocommit
(billing_deliver), which locks the account first; when another transaction changes the account's
subscriptions meanwhile, it waits for that one and decides from what it committed, in the same
statement. Real connections, real row locks, signed deliveries."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from psycopg import pq

from service.billing import delivery
from service.billing.delivery import Receipt
from service.billing.events import Envelope
from service.plans import PlanConfig
from service.quota.accounts import upsert_account
from service.webhooks import revenuecat, stripe
from tests.citus import on_cluster
from tests.conftest import STRIPE_SECRET
from tests.conftest import connect as connect_db
from tests.webhooks.helpers import body_of, fixture, now, sign, stripe_subscription_event

ACCOUNT = "acc_one_statement"
T = TypeVar("T")


def envelope(event: dict[str, Any]) -> Envelope:
    body = body_of(event)
    return stripe.verify(body, sign(body), [STRIPE_SECRET])


def receive(conn: Any, plans: PlanConfig, event: dict[str, Any]) -> Receipt:
    return delivery.receive(conn, plans, envelope(event), allowed=True, translate=stripe.translate)


def account_row(conn: Any, account_id: str = ACCOUNT) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT plan, subscription_status, billing_version FROM accounts WHERE id = %s", (account_id,)
    ).fetchone()
    assert row is not None
    return tuple(row)


def event(event_id: str, created: int, **fields: Any) -> dict[str, Any]:
    return stripe_subscription_event(event_id=event_id, created=created, account_id=ACCOUNT, **fields)


def wait_until_blocked(conn: Any, timeout: float = 20) -> None:
    """Until some other backend of this database waits on a lock (on a Citus cluster, on any node:
    the account's row lock is on its shard's node)."""
    waits = (
        "SELECT count(*) FROM citus_lock_waits"
        if on_cluster()
        else "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(waits).fetchone()
        if row and row[0]:
            return
        time.sleep(0.02)
    raise AssertionError("no delivery ever waited on the account's lock")


def while_held(
    conn: Any, db_url: str, plans: PlanConfig, hold: Callable[[Any], T], then: dict[str, Any]
) -> tuple[T, Receipt]:
    """Run `hold` in a transaction of its own that keeps the account locked, deliver `then` on a
    third connection meanwhile, commit once that delivery waits on the lock; both results."""
    results: list[Receipt | BaseException] = []

    def deliver() -> None:
        with connect_db(db_url) as c:
            try:
                results.append(receive(c, plans, then))
            except BaseException as e:  # surfaced below
                results.append(e)

    with connect_db(db_url) as holder:
        with holder.transaction():
            held = hold(holder)
            worker = threading.Thread(target=deliver)
            worker.start()
            wait_until_blocked(conn)
        worker.join(timeout=30)
    [receipt] = results
    assert isinstance(receipt, Receipt), receipt
    return held, receipt


def test_a_subscription_event_is_one_statement_that_bumps_the_version(conn: Any, plans: PlanConfig) -> None:
    upsert_account(conn, plans, account_id=ACCOUNT, kind="user")
    before = account_row(conn)

    receipt = receive(conn, plans, event("evt_1", now() - 10))

    assert (receipt.status, receipt.duplicate, receipt.locked) == ("applied", False, False)
    assert account_row(conn) == ("pro", "active", before[2] + 1)


def round_trips(conn: Any, work: Callable[[], object]) -> int:
    """How many statements `work` sends on `conn` (libpq's trace of the messages it sends: a Sync ends
    each extended-protocol statement, a Query is one simple one)."""
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            work()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        sent = [line.rstrip("\n").split("\t") for line in trace]
    return sum(1 for m in sent if len(m) > 2 and m[0] == "F" and m[2] in ("Sync", "Query"))


def test_a_delivery_naming_its_account_is_one_statement_and_one_found_by_its_customer_two(
    conn: Any, plans: PlanConfig
) -> None:
    """The account's part of a delivery names its account (one shard on Citus). An event that names
    an existing account is that account, so the delivery stays one statement; one found by its
    customer (or subscription) reads the billing tables first: a second statement."""
    upsert_account(conn, plans, account_id=ACCOUNT, kind="user", stripe_customer_id="cus_found")
    t = now() - 10
    named = event("evt_named", t)
    by_customer = stripe_subscription_event(
        event_id="evt_by_customer", created=t + 1, account_id=None, customer="cus_found"
    )

    assert round_trips(conn, lambda: receive(conn, plans, named)) == 1
    assert round_trips(conn, lambda: receive(conn, plans, by_customer)) == 2
    assert account_row(conn)[:2] == ("pro", "active")
    statuses = conn.execute("SELECT event_id, status, account_id FROM webhook_events ORDER BY id").fetchall()
    assert statuses == [("evt_named", "applied", ACCOUNT), ("evt_by_customer", "applied", ACCOUNT)]


def test_a_stale_or_duplicate_delivery_changes_nothing(conn: Any, plans: PlanConfig) -> None:
    upsert_account(conn, plans, account_id=ACCOUNT, kind="user")
    t = now() - 10
    receive(conn, plans, event("evt_new", t))
    after_first = account_row(conn)

    stale = receive(conn, plans, event("evt_old", t - 5, status="past_due"))
    again = receive(conn, plans, event("evt_new", t))

    assert (stale.status, stale.locked) == ("ignored", False)
    assert (again.duplicate, again.status, again.locked) == (True, "applied", False)
    assert account_row(conn) == after_first  # not even the version moved


def test_it_waits_for_a_concurrent_change_of_the_account(conn: Any, db_url: str, plans: PlanConfig) -> None:
    """The upgrade race, made deterministic: a delivery creating subscription 2 holds the account
    (uncommitted) while a delivery canceling subscription 1 starts. A snapshot taken before the
    first commits does not see subscription 2; deciding from it would leave the account canceled
    although an active subscription exists. The second delivery must wait on the account's lock and
    decide from a snapshot taken after it: still one statement."""
    upsert_account(conn, plans, account_id=ACCOUNT, kind="user")
    t = now() - 100
    receive(conn, plans, event("evt_sub1_created", t, sub_id="sub_1", price="pro_monthly"))

    created, receipt = while_held(
        conn,
        db_url,
        plans,
        lambda holder: receive(
            holder, plans, event("evt_sub2", t + 1, sub_id="sub_2", price="basic_monthly")
        ),
        then=event("evt_sub1_deleted", t + 2, sub_id="sub_1", status="canceled"),
    )

    assert created.status == "applied"
    assert (receipt.status, receipt.locked) == ("applied", False)
    assert account_row(conn)[:2] == ("basic", "active")  # sub_2, active, decides


def test_a_replay_also_moves_the_version(conn: Any, db_url: str, plans: PlanConfig) -> None:
    """A replay (the locked path) holds the account's lock and bumps billing_version, so a delivery
    that starts meanwhile waits for it and sees the replayed subscription."""
    t = now() - 100
    unmatched = receive(conn, plans, event("evt_before_account", t, sub_id="sub_2", price="basic_monthly"))
    assert unmatched.status == "unmatched" and unmatched.id is not None
    upsert_account(conn, plans, account_id=ACCOUNT, kind="user")
    receive(conn, plans, event("evt_sub1_created", t + 1, sub_id="sub_1", price="pro_monthly"))
    version = account_row(conn)[2]
    inbox_id = unmatched.id

    replayed, receipt = while_held(
        conn,
        db_url,
        plans,
        lambda holder: delivery.replay(
            holder, plans, inbox_id, translate_for=lambda _: stripe.translate, actor="t"
        ),
        then=event("evt_sub1_deleted", t + 2, sub_id="sub_1", status="canceled"),
    )

    assert replayed.status == "applied"
    assert not receipt.locked  # it waited, in its one statement
    plan, status, after = account_row(conn)
    assert (plan, status) == ("basic", "active")
    assert after > version


def test_a_transfer_moves_the_version_of_the_account_it_fills(
    conn: Any, db_url: str, plans: PlanConfig
) -> None:
    """A RevenueCat TRANSFER (the locked path) moves a subscription into an account whose tier it
    does not change; it holds the account's lock (and bumps billing_version), so a delivery that
    starts meanwhile waits for it and decides with the transferred subscription."""
    source, target = "acc_7f3c21", "acc_c0ffee"  # the transfer fixture's accounts
    for a in (source, target):
        upsert_account(conn, plans, account_id=a, kind="user")
    renewal = revenuecat.parse(body_of(fixture("revenuecat", "renewal")))
    assert (
        delivery.receive(conn, plans, renewal, allowed=True, translate=revenuecat.translate).status
        == "applied"
    )
    t = now() - 100  # the target also pays through Stripe, on Basic, with a newer event than RevenueCat's
    receive(
        conn,
        plans,
        stripe_subscription_event(
            event_id="evt_s1", created=t, sub_id="sub_1", price="basic_monthly", account_id=target
        ),
    )
    transfer = revenuecat.parse(body_of(fixture("revenuecat", "transfer")))

    def hold(holder: Any) -> Receipt:
        moved = delivery.receive(holder, plans, transfer, allowed=True, translate=revenuecat.translate)
        assert account_row(holder, target)[:2] == ("basic", "active")  # Stripe's newer event decides
        return moved

    moved, receipt = while_held(
        conn,
        db_url,
        plans,
        hold,
        then=stripe_subscription_event(
            event_id="evt_s2", created=t + 1, sub_id="sub_1", status="canceled", account_id=target
        ),
    )

    assert (moved.status, moved.locked) == ("applied", True)
    assert not receipt.locked  # it waited, in its one statement
    assert account_row(conn, target)[:2] == ("pro", "active")  # the transferred subscription decides


def test_a_subscription_moving_from_another_account_takes_the_locked_path(
    conn: Any, plans: PlanConfig
) -> None:
    """The one case the statement gives way on for an account it locked: the subscription belongs to
    another account, which it has not locked. The delivery runs again with both accounts locked, and
    the previous owner follows its remaining subscriptions (none: its tier stays, expired)."""
    other = "acc_one_statement_before"
    for a in (ACCOUNT, other):
        upsert_account(conn, plans, account_id=a, kind="user")
    t = now() - 100
    first = stripe_subscription_event(event_id="evt_owner_1", created=t, account_id=other, customer="cus_a")
    assert receive(conn, plans, first).status == "applied"

    moved = receive(conn, plans, event("evt_owner_2", t + 1, customer="cus_b"))

    assert (moved.status, moved.locked) == ("applied", True)
    assert account_row(conn)[:2] == ("pro", "active")
    assert account_row(conn, other)[:2] == ("pro", "expired")
    owner = conn.execute("SELECT account_id, prior_account_id FROM subscriptions").fetchall()
    assert owner == [(ACCOUNT, other)]

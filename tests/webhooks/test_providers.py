"""Billing events as the providers really send them (issue 11), built from the providers' own
published payloads (tests/fixtures/*/samples: Stripe's openapi fixtures, RevenueCat's sample events)
and the vendored fixtures, with only ids and times substituted."""

from __future__ import annotations

import copy
import json
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.billing import delivery, expiry
from service.webhooks import stripe as stripe_adapter
from service.webhooks.samples import SAMPLES
from tests.conftest import FIXTURES
from tests.webhooks.helpers import (
    CUSTOMER,
    STRIPE_ACCOUNT,
    SUB_ID,
    create_account,
    fixture,
    post_revenuecat,
    post_stripe,
    revenuecat_event,
    sign,
    state,
    stripe_subscription_event,
)
from tests.webhooks.helpers import (
    inbox as inbox_rows,
)

PRO = ("pro", "active", 500, "plan")
ANON = "$RCAnonymousID:87c6049c58069238dce29853916d624c"


def sample(provider: str, name: str) -> dict[str, Any]:
    path = FIXTURES / provider / "samples" / f"{name}.json"
    data: dict[str, Any] = json.loads((path if path.exists() else SAMPLES / provider / path.name).read_text())
    return data


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def rc_sample(name: str, *, event_id: str, at: datetime, **fields: Any) -> dict[str, Any]:
    """A RevenueCat sample event with our ids and times: `at` is its event time."""
    event = sample("revenuecat", name)
    event["event"].update(id=event_id, event_timestamp_ms=ms(at), **fields)
    return event


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


# 1. Same-second ties end the same in every delivery order ---------------------------------------

T = int(time.time()) - 3600

SAME_SECOND = {
    "created incomplete, updated active": (
        ("customer.subscription.created", "incomplete"),
        ("customer.subscription.updated", "active"),
        PRO,
    ),
    "created trialing, updated active": (
        ("customer.subscription.created", "trialing"),
        ("customer.subscription.updated", "active"),
        PRO,
    ),
    "updated active, updated past_due": (
        ("customer.subscription.updated", "active"),
        ("customer.subscription.updated", "past_due"),
        ("pro", "past_due", 500, "plan"),
    ),
    "updated active, deleted canceled": (
        ("customer.subscription.updated", "active"),
        ("customer.subscription.deleted", "canceled"),
        ("pro", "canceled", 50, "free_fallback"),
    ),
}


@pytest.mark.parametrize("case", sorted(SAME_SECOND))
@pytest.mark.parametrize("reverse", [False, True], ids=["in order", "reversed"])
def test_same_second_events_end_the_same_in_every_order(
    client: Any, keys: Any, acc: str, case: str, reverse: bool
) -> None:
    first, second, expected = SAME_SECOND[case]
    events = [
        stripe_subscription_event(event_id=f"evt_{i}", created=T, type_=type_, status=status)
        for i, (type_, status) in enumerate((first, second))
    ]
    for event in reversed(events) if reverse else events:
        assert post_stripe(client, event).status_code == 200
    assert state(client, keys, acc) == expected


# 2. Linking applies the stored unmatched events at once, in provider order ----------------------


def unlinked_subscription_events() -> list[dict[str, Any]]:
    """Two events of a subscription whose metadata names no account, delivered newest first."""
    active = stripe_subscription_event(event_id="evt_active", created=T, account_id=None)
    past_due = stripe_subscription_event(
        event_id="evt_past_due", created=T + 60, status="past_due", account_id=None
    )
    return [past_due, active]


def assert_waiting_applied(client: Any, keys: Any, conn: Any) -> None:
    assert state(client, keys, STRIPE_ACCOUNT) == ("pro", "past_due", 500, "plan")
    subs = [r for r in inbox_rows(conn) if r["type"].startswith("customer.subscription")]
    # both applied: replayed oldest first (newest first, the older would be ignored as stale)
    assert [r["status"] for r in subs] == ["applied", "applied"]
    assert all(r["account_id"] == STRIPE_ACCOUNT for r in subs)


def test_checkout_with_client_reference_id_applies_waiting_events(
    client: Any, keys: Any, conn: Any, acc: str
) -> None:
    for event in unlinked_subscription_events():
        assert post_stripe(client, event).json["status"] == "unmatched"
    assert state(client, keys, acc)[:2] == ("free", "none")
    r = post_stripe(client, fixture("stripe", "checkout.session.completed"))
    assert r.json["status"] == "applied"
    assert_waiting_applied(client, keys, conn)


def test_invoice_naming_the_account_applies_waiting_events(
    client: Any, keys: Any, conn: Any, acc: str
) -> None:
    for event in unlinked_subscription_events():
        post_stripe(client, event)
    assert post_stripe(client, fixture("stripe", "invoice.payment_failed")).json["status"] == "applied"
    assert_waiting_applied(client, keys, conn)


def test_put_account_with_customer_applies_waiting_events(
    client: Any, keys: Any, conn: Any, acc: str
) -> None:
    for event in unlinked_subscription_events():
        post_stripe(client, event)
    create_account(client, keys, acc, stripe_customer_id=CUSTOMER)
    assert_waiting_applied(client, keys, conn)


def test_account_creation_applies_waiting_events_in_provider_order(client: Any, keys: Any, conn: Any) -> None:
    older = stripe_subscription_event(event_id="evt_a", created=T)
    newer = stripe_subscription_event(event_id="evt_b", created=T + 60, status="canceled")
    for event in (newer, older):
        assert post_stripe(client, event).json["status"] == "unmatched"
    r = client.put(f"/v1/accounts/{STRIPE_ACCOUNT}", json={"kind": "user"}, headers=keys["product"])
    assert r.status_code == 201
    assert (r.json["plan"], r.json["subscription_status"]) == ("pro", "canceled")  # the view shows it
    assert [row["status"] for row in inbox_rows(conn)] == ["applied", "applied"]  # oldest first


def test_revenuecat_alias_applies_waiting_events(client: Any, keys: Any, conn: Any) -> None:
    """A purchase made while the app knew the user only by an anonymous id waits; a later event that
    aliases the anonymous id to the account applies it."""
    create_account(client, keys, "acc_7f3c21")
    at = now() - timedelta(hours=2)
    anonymous = rc_sample(
        "initial_purchase",
        event_id="rc-anon",
        at=at,
        app_user_id=ANON,
        aliases=[ANON],
        original_app_user_id=ANON,
        expiration_at_ms=ms(at + timedelta(days=7)),
        entitlement_ids=["pro"],
    )
    assert post_revenuecat(client, anonymous).json["status"] == "unmatched"
    aliased = rc_sample(
        "non_renewing_purchase",
        event_id="rc-aliased",
        at=at + timedelta(minutes=5),
        app_user_id="acc_7f3c21",
        aliases=[ANON, "acc_7f3c21"],
        original_app_user_id=ANON,
        transaction_id="900000000000001",
        original_transaction_id="900000000000001",
        entitlement_ids=["basic"],
    )
    assert post_revenuecat(client, aliased).json["status"] == "applied"
    rows = {r["event_id"]: r for r in inbox_rows(conn)}
    assert (rows["rc-anon"]["status"], rows["rc-anon"]["account_id"]) == ("applied", "acc_7f3c21")
    assert state(client, keys, "acc_7f3c21")[:2] in {("pro", "active"), ("basic", "active")}
    subs = conn.execute("SELECT plan, status FROM subscriptions ORDER BY plan").fetchall()
    assert subs == [("basic", "active"), ("pro", "active")]


# 3. Every invoice layout links ------------------------------------------------------------------


def invoice_2023(*, event_id: str, subscription_details: dict[str, Any] | None = None) -> dict[str, Any]:
    """fixtures3.json's invoice (before API 2025-03-31: top-level `subscription`), our ids; with
    `subscription_details`, the layout of API 2023-08 .. 2025-02."""
    event = copy.deepcopy(sample("stripe", "invoice.fixtures3-2023"))
    event.update(id=event_id, created=T + 120)
    invoice = event["data"]["object"]
    invoice.update(customer=CUSTOMER, subscription=SUB_ID)
    if subscription_details is not None:
        invoice["subscription_details"] = subscription_details
    return event


def test_invoice_with_top_level_subscription_details_links(
    client: Any, keys: Any, conn: Any, acc: str
) -> None:
    for event in unlinked_subscription_events():
        post_stripe(client, event)
    invoice = invoice_2023(event_id="evt_inv", subscription_details={"metadata": {"account_id": acc}})
    r = post_stripe(client, invoice)
    assert r.json["status"] == "applied"
    assert_waiting_applied(client, keys, conn)
    [link] = conn.execute("SELECT customer_id, account_id FROM customer_links").fetchall()
    assert link == (CUSTOMER, acc)


def test_invoice_with_top_level_subscription_links_through_the_subscription(
    client: Any, keys: Any, conn: Any, acc: str
) -> None:
    """Pre-2023 layout: no metadata; the subscription's owner is the account."""
    post_stripe(client, stripe_subscription_event(event_id="evt_sub", created=T, customer="cus_other"))
    r = post_stripe(client, invoice_2023(event_id="evt_inv"))
    assert r.json["status"] == "applied"
    row = next(r for r in inbox_rows(conn) if r["event_id"] == "evt_inv")
    assert row["account_id"] == acc and "linked customer" in row["note"]
    assert (CUSTOMER, acc) in conn.execute("SELECT customer_id, account_id FROM customer_links").fetchall()


# 4. RevenueCat expiration bounds access ---------------------------------------------------------


def test_purchase_whose_expiration_passed_grants_nothing(client: Any, keys: Any) -> None:
    create_account(client, keys, "acc_7f3c21")
    at = now() - timedelta(days=10)
    event = rc_sample(
        "initial_purchase",
        event_id="rc-old",
        at=at,
        app_user_id="acc_7f3c21",
        expiration_at_ms=ms(at + timedelta(days=7)),
    )
    assert post_revenuecat(client, event).json["status"] == "applied"
    assert state(client, keys, "acc_7f3c21") == ("pro", "expired", 50, "free_fallback")


def test_lifetime_purchase_keeps_access_and_a_timed_one_ends_by_the_worker(
    client: Any, keys: Any, conn: Any, plans: Any
) -> None:
    for a in ("acc_life", "acc_week"):
        create_account(client, keys, a)
    at = now() - timedelta(minutes=5)
    lifetime = rc_sample("non_renewing_purchase", event_id="rc-life", at=at, app_user_id="acc_life")
    assert lifetime["event"]["expiration_at_ms"] is None  # as published: null = lifetime
    week = rc_sample(
        "non_renewing_purchase",
        event_id="rc-week",
        at=at,
        app_user_id="acc_week",
        original_app_user_id="$RCAnonymousID:week",
        aliases=[],
        transaction_id="900000000000002",
        original_transaction_id="900000000000002",
        expiration_at_ms=ms(at + timedelta(days=7)),
    )
    for event in (lifetime, week):
        assert post_revenuecat(client, event).json["status"] == "applied"
    assert state(client, keys, "acc_life") == PRO and state(client, keys, "acc_week") == PRO

    assert expiry.end_expired(conn, plans).subscriptions == 0  # nothing has ended yet
    done = expiry.end_expired(conn, plans, at=at + timedelta(days=8))
    assert (done.accounts, done.subscriptions) == (1, 1)
    assert state(client, keys, "acc_week") == ("pro", "expired", 50, "free_fallback")
    assert state(client, keys, "acc_life") == PRO
    audit = conn.execute(
        "SELECT DISTINCT actor FROM audit_log WHERE account_id = 'acc_week' AND actor LIKE 'system:%'"
    ).fetchall()
    assert audit == [("system:expire_access",)]
    assert expiry.end_expired(conn, plans, at=at + timedelta(days=8)).subscriptions == 0  # twice: no-op


def test_refund_with_past_expiration_ends_access_at_once(client: Any, keys: Any) -> None:
    create_account(client, keys, "user_1234")
    bought = now() - timedelta(days=2)
    purchase = rc_sample(
        "initial_purchase",
        event_id="rc-buy",
        at=bought,
        app_user_id="user_1234",
        transaction_id="100000000000000",
        original_transaction_id="100000000000000",
        expiration_at_ms=ms(bought + timedelta(days=30)),
    )
    assert post_revenuecat(client, purchase).json["status"] == "applied"
    assert state(client, keys, "user_1234") == PRO
    # RevenueCat's refund sample: CUSTOMER_SUPPORT, its expiration set back before the event
    refund = rc_sample("refund", event_id="rc-refund", at=now() - timedelta(minutes=1))
    refund["event"]["expiration_at_ms"] = ms(now() - timedelta(minutes=2))
    assert post_revenuecat(client, refund).json["status"] == "applied"
    assert state(client, keys, "user_1234") == ("pro", "expired", 50, "free_fallback")


def test_billing_error_keeps_the_grace_period_although_the_period_ended(client: Any, keys: Any) -> None:
    """A failed renewal's BILLING_ISSUE and CANCELLATION (BILLING_ERROR) carry the ended period's
    expiration; access continues through the grace period (to its end, if given)."""
    create_account(client, keys, "acc_91d0be")
    ended = ms(now() - timedelta(hours=1))
    issue = revenuecat_event(
        "billing_issue", expiration_at_ms=ended, grace_period_expiration_at_ms=ms(now() + timedelta(days=6))
    )
    assert post_revenuecat(client, issue).json["status"] == "applied"
    assert state(client, keys, "acc_91d0be") == ("basic", "past_due", 100, "plan")
    at = issue["event"]["event_timestamp_ms"] + 1000
    cancel = revenuecat_event(
        "billing_issue", event_id="rc-cancel", at_ms=at, type="CANCELLATION", cancel_reason="BILLING_ERROR"
    )
    cancel["event"].update(expiration_at_ms=ended, grace_period_expiration_at_ms=None)
    assert post_revenuecat(client, cancel).json["status"] == "applied"
    assert state(client, keys, "acc_91d0be") == ("basic", "past_due", 100, "plan")


def test_temporary_entitlement_grant_lasts_at_most_a_day(
    client: Any, keys: Any, conn: Any, plans: Any
) -> None:
    create_account(client, keys, "acc_7f3c21")
    post_revenuecat(client, fixture("revenuecat", "expiration"))  # pro, expired
    at = now() - timedelta(minutes=1)
    grant = rc_sample("temporary_entitlement_grant", event_id="rc-temp", at=at, app_user_id="acc_7f3c21")
    assert post_revenuecat(client, grant).json["status"] == "applied"
    assert state(client, keys, "acc_7f3c21") == PRO
    expiry.end_expired(conn, plans, at=at + timedelta(hours=23))
    assert state(client, keys, "acc_7f3c21") == PRO
    expiry.end_expired(conn, plans, at=at + timedelta(hours=24))
    assert state(client, keys, "acc_7f3c21") == ("pro", "expired", 50, "free_fallback")


def test_temporary_grant_is_superseded_by_the_purchase_events(client: Any, keys: Any, conn: Any) -> None:
    create_account(client, keys, "acc_7f3c21")
    at = now() - timedelta(minutes=10)
    grant = rc_sample("temporary_entitlement_grant", event_id="rc-temp", at=at, app_user_id="acc_7f3c21")
    post_revenuecat(client, grant)
    assert state(client, keys, "acc_7f3c21")[:2] == ("free", "active")
    # the store never confirmed the purchase: its own EXPIRATION ends the access the grant gave
    lost = revenuecat_event("expiration", event_id="rc-lost", at_ms=ms(at + timedelta(minutes=1)))
    assert post_revenuecat(client, lost).json["status"] == "applied"
    assert state(client, keys, "acc_7f3c21") == ("pro", "expired", 50, "free_fallback")
    temp = conn.execute(
        "SELECT status FROM subscriptions WHERE subscription_id LIKE 'temporary:%'"
    ).fetchall()
    assert temp == [("expired",)]


# 5. Provider times are sanity-checked -----------------------------------------------------------


def test_revenuecat_transfer_sample_dated_4466_does_not_freeze_the_subscription(
    client: Any, keys: Any, conn: Any
) -> None:
    for a in ("acc_7f3c21", "acc_c0ffee"):
        create_account(client, keys, a)
    post_revenuecat(client, fixture("revenuecat", "renewal"))
    transfer = sample("revenuecat", "transfer")
    transfer["event"].update(transferred_from=["acc_7f3c21"], transferred_to=["acc_c0ffee"])
    r = post_revenuecat(client, transfer)
    assert r.json["status"] == "ignored"
    row = next(r for r in inbox_rows(conn) if r["type"] == "TRANSFER")
    assert "4466" in row["note"] and "not applied" in row["note"]
    # an admin replay checks it against its stored receipt time: still not applied
    again = client.post(f"/v1/admin/events/{r.json['id']}/replay", headers=keys["admin"])
    assert again.json["status"] == "ignored"
    assert state(client, keys, "acc_7f3c21") == PRO and state(client, keys, "acc_c0ffee")[:2] == (
        "free",
        "none",
    )
    # a real later event still orders
    later = revenuecat_event("expiration", event_id="rc-later")
    assert post_revenuecat(client, later).json["status"] == "applied"
    assert state(client, keys, "acc_7f3c21")[1] == "expired"


def test_stripe_event_dated_days_ahead_is_not_applied(client: Any, keys: Any, acc: str) -> None:
    ahead = stripe_subscription_event(event_id="evt_ahead", created=int(time.time()) + 2 * 86_400)
    assert post_stripe(client, ahead).json["status"] == "ignored"
    assert (
        post_stripe(client, stripe_subscription_event(event_id="evt_now", created=T)).json["status"]
        == "applied"
    )
    assert state(client, keys, acc) == PRO


# 6. Multi-item subscriptions, and invoices of a linked customer ---------------------------------


def test_multi_item_subscription_gets_the_highest_plan(client: Any, keys: Any, acc: str) -> None:
    event = stripe_subscription_event(event_id="evt_multi", created=T)
    items = event["data"]["object"]["items"]["data"]
    basic = copy.deepcopy(items[0])
    basic.update(id="si_basic_item")
    basic["price"].update(id="price_basic_monthly", lookup_key="basic_monthly")
    basic["plan"].update(id="price_basic_monthly")
    items.append(basic)  # pro first, basic second: the tier is pro, the higher, whatever the order
    assert post_stripe(client, event).json["status"] == "applied"
    assert state(client, keys, acc) == PRO
    items.reverse()
    event.update(id="evt_multi_2", created=T + 1)
    post_stripe(client, event)
    assert state(client, keys, acc) == PRO


def test_invoice_for_a_linked_customer_says_so(client: Any, keys: Any, conn: Any, acc: str) -> None:
    post_stripe(client, stripe_subscription_event(event_id="evt_sub", created=T))  # links the customer
    for event in (invoice_2023(event_id="evt_inv_old"), fixture("stripe", "invoice.payment_failed")):
        assert post_stripe(client, event).json["status"] == "applied"
    notes = [r["note"] for r in inbox_rows(conn) if r["type"].startswith("invoice.")]
    assert notes == [f"customer {CUSTOMER!r} was linked to account {acc!r} already"] * 2


def test_invoice_of_an_unknown_customer_naming_nothing_is_ignored_with_a_note(client: Any, conn: Any) -> None:
    event = invoice_2023(event_id="evt_inv_unknown")
    event["data"]["object"].update(subscription=None, customer="cus_unknown")  # a one-off invoice
    assert post_stripe(client, event).json["status"] == "ignored"
    [row] = inbox_rows(conn)
    assert row["note"] == (
        "names no account or subscription, and customer 'cus_unknown' is not linked to an account"
    )


# The fast path does not swallow unexpected errors -----------------------------------------------


def test_an_unexpected_error_on_the_fast_path_is_logged_and_stored_failed(
    conn: Any, plans: Any, acc: str, caplog: Any
) -> None:
    """A real error inside the one statement (a trigger that raises, counting its calls with a
    sequence, which no rollback undoes) is not retried on the locked path: only the designed
    conflicts go there."""
    conn.execute("CREATE SEQUENCE test_boom_calls")
    conn.execute(
        "CREATE FUNCTION test_boom() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM nextval('test_boom_calls'); RAISE EXCEPTION 'boom'; END $$"
    )
    conn.execute(
        "CREATE TRIGGER test_boom BEFORE INSERT ON subscriptions FOR EACH ROW EXECUTE FUNCTION test_boom()"
    )
    body = json.dumps(stripe_subscription_event(event_id="evt_boom", created=T)).encode()
    env = stripe_adapter.verify(body, sign(body), ["whsec_test_secret"])
    with caplog.at_level(logging.DEBUG, logger="service.billing.delivery"):
        receipt = delivery.receive(conn, plans, env, allowed=True, translate=stripe_adapter.translate)
    assert (receipt.status, receipt.locked) == ("failed", False)
    assert conn.execute("SELECT last_value FROM test_boom_calls").fetchone() == (1,)  # tried once
    [row] = inbox_rows(conn)
    assert row["status"] == "failed" and "boom" in row["error"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "evt_boom" in errors[0].getMessage()

"""Order safety: whatever order a subscription's events arrive in, the newest one decides; a
canceled or expired subscription is never resurrected by a late older event; an active
subscription wins over ended ones on the account."""

from __future__ import annotations

from itertools import permutations
from typing import Any

import pytest

from tests.webhooks.helpers import (
    create_account,
    fixture,
    inbox,
    post_revenuecat,
    post_stripe,
    revenuecat_event,
    state,
    stripe_subscription_event,
)

T1 = 1_790_000_000

STRIPE_EVENTS = {
    "updated_t1": stripe_subscription_event(event_id="evt_t1", created=T1, price="basic_monthly"),
    "updated_t2": stripe_subscription_event(
        event_id="evt_t2", created=T1 + 60, price="pro_monthly", status="past_due"
    ),
    "deleted_t3": stripe_subscription_event(
        event_id="evt_t3", created=T1 + 120, type_="customer.subscription.deleted", status="canceled"
    ),
}


@pytest.mark.parametrize("order", list(permutations(STRIPE_EVENTS)), ids="-".join)
def test_stripe_every_order_ends_in_the_newest_state(
    client: Any, keys: Any, conn: Any, acc: str, order: Any
) -> None:
    for name in order:
        assert post_stripe(client, STRIPE_EVENTS[name]).status_code == 200
    assert state(client, keys, acc) == ("pro", "canceled", 50, "free_fallback")
    assert conn.execute("SELECT status, event_id FROM subscriptions").fetchall() == [("canceled", "evt_t3")]
    statuses = {row["event_id"]: row["status"] for row in inbox(conn)}
    assert statuses["evt_t3"] == "applied"
    # whatever came after t3 was not applied
    for name in order[order.index("deleted_t3") + 1 :]:
        assert statuses[STRIPE_EVENTS[name]["id"]] == "ignored"


RC_T1 = fixture("revenuecat", "initial_purchase")["event"]["event_timestamp_ms"]
RC_EVENTS = {
    "initial_purchase": fixture("revenuecat", "initial_purchase"),
    "cancellation": fixture("revenuecat", "cancellation"),
    "expiration": fixture("revenuecat", "expiration"),
}


@pytest.mark.parametrize("order", list(permutations(RC_EVENTS)), ids="-".join)
def test_revenuecat_every_order_ends_in_the_newest_state(
    client: Any, keys: Any, conn: Any, order: Any
) -> None:
    create_account(client, keys, "acc_7f3c21")
    for name in order:
        assert post_revenuecat(client, RC_EVENTS[name]).status_code == 200
    assert state(client, keys, "acc_7f3c21") == ("pro", "expired", 50, "free_fallback")
    [(status, event_id)] = conn.execute("SELECT status, event_id FROM subscriptions").fetchall()
    assert (status, event_id) == ("expired", RC_EVENTS["expiration"]["event"]["id"])


def test_canceled_stripe_subscription_is_never_reopened(client: Any, keys: Any, conn: Any, acc: str) -> None:
    """Stripe never reopens a canceled subscription, so even a newer non-final event does not."""
    post_stripe(client, STRIPE_EVENTS["deleted_t3"])
    late = stripe_subscription_event(event_id="evt_t9", created=T1 + 999, status="active")
    r = post_stripe(client, late)
    assert r.json["status"] == "ignored"
    assert state(client, keys, acc) == ("pro", "canceled", 50, "free_fallback")
    assert "for good" in inbox(conn)[-1]["note"]


@pytest.mark.parametrize("first", ["updated", "deleted"])
def test_equal_provider_time_the_ended_status_wins(client: Any, keys: Any, acc: str, first: str) -> None:
    """Stripe `created` has 1 s resolution: at a tie, the ended status wins in either order."""
    events = {
        "updated": stripe_subscription_event(event_id="evt_a", created=T1, status="active"),
        "deleted": stripe_subscription_event(
            event_id="evt_b", created=T1, type_="customer.subscription.deleted", status="canceled"
        ),
    }
    for name in (first, "deleted" if first == "updated" else "updated"):
        post_stripe(client, events[name])
    assert state(client, keys, acc)[1] == "canceled"


def test_an_active_subscription_wins_over_ended_ones(client: Any, keys: Any, conn: Any, acc: str) -> None:
    """A late event about an old subscription cannot downgrade an account that has a new one."""
    post_stripe(
        client,
        stripe_subscription_event(event_id="old1", created=T1, sub_id="sub_old", price="basic_monthly"),
    )
    post_stripe(client, stripe_subscription_event(event_id="new1", created=T1 + 100, sub_id="sub_new"))
    assert state(client, keys, acc) == ("pro", "active", 500, "plan")
    old_end = stripe_subscription_event(
        event_id="old2",
        created=T1 + 200,
        sub_id="sub_old",
        price="basic_monthly",
        type_="customer.subscription.deleted",
        status="canceled",
    )
    assert post_stripe(client, old_end).json["status"] == "applied"
    assert state(client, keys, acc) == ("pro", "active", 500, "plan")
    # and when the new one ends too, the account follows the most recent ended one
    new_end = stripe_subscription_event(
        event_id="new2",
        created=T1 + 300,
        sub_id="sub_new",
        type_="customer.subscription.deleted",
        status="canceled",
    )
    post_stripe(client, new_end)
    assert state(client, keys, acc) == ("pro", "canceled", 50, "free_fallback")


def test_stripe_incomplete_expired_maps_to_expired(client: Any, keys: Any, acc: str) -> None:
    post_stripe(client, stripe_subscription_event(event_id="e1", created=T1, status="incomplete"))
    assert state(client, keys, acc) == ("pro", "incomplete", 50, "free_fallback")
    post_stripe(client, stripe_subscription_event(event_id="e2", created=T1 + 1, status="incomplete_expired"))
    assert state(client, keys, acc) == ("pro", "expired", 50, "free_fallback")


@pytest.mark.parametrize(
    ("status", "limit", "source"),
    [("trialing", 500, "plan"), ("unpaid", 50, "free_fallback"), ("paused", 50, "free_fallback")],
)
def test_stripe_statuses(client: Any, keys: Any, acc: str, status: str, limit: int, source: str) -> None:
    post_stripe(client, stripe_subscription_event(event_id="e1", created=T1, status=status))
    assert state(client, keys, acc) == ("pro", status, limit, source)


def test_revenuecat_renewal_after_expiration_restores_access(client: Any, keys: Any) -> None:
    """Unlike Stripe, a RevenueCat subscription chain can come back (resubscribe in the same group)."""
    create_account(client, keys, "acc_7f3c21")
    post_revenuecat(client, RC_EVENTS["expiration"])
    at = RC_EVENTS["expiration"]["event"]["event_timestamp_ms"]
    post_revenuecat(client, revenuecat_event("renewal", event_id="older", at_ms=at - 1))
    assert state(client, keys, "acc_7f3c21")[1] == "expired"
    post_revenuecat(client, revenuecat_event("renewal", event_id="newer", at_ms=at + 1))
    assert state(client, keys, "acc_7f3c21") == ("pro", "active", 500, "plan")

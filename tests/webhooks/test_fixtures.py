"""Every vendored fixture through the HTTP endpoint, checking the account's plan, status, effective
limit and limit_source afterwards."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webhooks.helpers import (
    CUSTOMER,
    STRIPE_ACCOUNT,
    account,
    create_account,
    fixture,
    inbox,
    post_revenuecat,
    post_stripe,
    revenuecat_event,
    revenuecat_fixtures,
    state,
    stripe_fixtures,
)

FREE = ("free", "none", 50, "plan")

# Each Stripe fixture alone, on a fresh free account: (inbox status, account state afterwards).
STRIPE_ALONE = {
    "customer.subscription.updated": ("applied", ("pro", "active", 500, "plan")),
    "customer.subscription.updated.past_due": ("applied", ("pro", "past_due", 500, "plan")),
    "customer.subscription.deleted": ("applied", ("pro", "canceled", 50, "free_fallback")),
    "invoice.payment_failed": ("applied", FREE),  # links the customer; status comes from the subscription
    "checkout.session.completed": ("applied", FREE),  # links the customer
}

# Each RevenueCat fixture alone, on fresh accounts acc_7f3c21 and acc_91d0be.
REVENUECAT_ALONE = {
    "initial_purchase": ("acc_7f3c21", "applied", ("pro", "active", 500, "plan")),
    "renewal": ("acc_7f3c21", "applied", ("pro", "active", 500, "plan")),
    "cancellation": ("acc_7f3c21", "applied", ("pro", "active", 500, "plan")),
    "expiration": ("acc_7f3c21", "applied", ("pro", "expired", 50, "free_fallback")),
    "billing_issue": ("acc_91d0be", "applied", ("basic", "past_due", 100, "plan")),
    "product_change": ("acc_91d0be", "ignored", FREE),
    "transfer": ("acc_c0ffee", "applied", FREE),  # nothing stored to move yet
}


def test_every_fixture_is_covered() -> None:
    assert sorted(STRIPE_ALONE) == stripe_fixtures()
    assert sorted(REVENUECAT_ALONE) == revenuecat_fixtures()


@pytest.mark.parametrize("name", sorted(STRIPE_ALONE))
def test_stripe_fixture_alone(client: Any, keys: Any, conn: Any, acc: str, name: str) -> None:
    status, expected = STRIPE_ALONE[name]
    r = post_stripe(client, fixture("stripe", name))
    assert r.status_code == 200, r.json
    assert r.json["status"] == status and r.json["duplicate"] is False
    assert state(client, keys, acc) == expected
    [row] = inbox(conn)
    assert (row["provider"], row["type"], row["status"], row["account_id"]) == (
        "stripe",
        name.split(".past")[0],
        status,
        acc,
    )


@pytest.mark.parametrize("name", sorted(REVENUECAT_ALONE))
def test_revenuecat_fixture_alone(client: Any, keys: Any, conn: Any, name: str) -> None:
    account_id, status, expected = REVENUECAT_ALONE[name]
    for a in ("acc_7f3c21", "acc_91d0be", "acc_c0ffee"):
        create_account(client, keys, a)
    r = post_revenuecat(client, fixture("revenuecat", name))
    assert r.status_code == 200, r.json
    assert r.json["status"] == status
    assert state(client, keys, account_id) == expected
    [row] = inbox(conn)
    assert (row["provider"], row["status"]) == ("revenuecat", status)


def test_stripe_story(client: Any, keys: Any, conn: Any, acc: str) -> None:
    """Checkout, upgrade, failed renewal, cancellation: tier and status at every step."""
    steps = [
        ("checkout.session.completed", FREE),
        ("customer.subscription.updated", ("pro", "active", 500, "plan")),
        ("invoice.payment_failed", ("pro", "active", 500, "plan")),
        ("customer.subscription.updated.past_due", ("pro", "past_due", 500, "plan")),
        ("customer.subscription.deleted", ("pro", "canceled", 50, "free_fallback")),
    ]
    for name, expected in steps:
        r = post_stripe(client, fixture("stripe", name))
        assert (r.status_code, r.json["status"]) == (200, "applied"), (name, r.json)
        assert state(client, keys, acc) == expected, name
    assert [row["status"] for row in inbox(conn)] == ["applied"] * 5
    # the checkout taught us the customer: an event naming only the customer now resolves
    link = conn.execute(
        "SELECT account_id FROM customer_links WHERE customer_id = %s", (CUSTOMER,)
    ).fetchone()
    assert link == (acc,)


def test_revenuecat_story(client: Any, keys: Any, conn: Any) -> None:
    """Purchase, renewal, cancellation (access kept), expiration (free fallback), resubscription."""
    create_account(client, keys, "acc_7f3c21")
    steps = [
        ("initial_purchase", ("pro", "active", 500, "plan")),
        ("renewal", ("pro", "active", 500, "plan")),
        ("cancellation", ("pro", "active", 500, "plan")),
        ("expiration", ("pro", "expired", 50, "free_fallback")),
    ]
    for name, expected in steps:
        r = post_revenuecat(client, fixture("revenuecat", name))
        assert (r.status_code, r.json["status"]) == (200, "applied"), (name, r.json)
        assert state(client, keys, "acc_7f3c21") == expected, name
    # a later renewal (the user resubscribed in the same subscription group) restores Pro
    later = fixture("revenuecat", "expiration")["event"]["event_timestamp_ms"] + 86_400_000
    r = post_revenuecat(client, revenuecat_event("renewal", event_id="resub-1", at_ms=later))
    assert r.json["status"] == "applied"
    assert state(client, keys, "acc_7f3c21") == ("pro", "active", 500, "plan")


def test_revenuecat_billing_issue_then_product_change(client: Any, keys: Any, conn: Any) -> None:
    create_account(client, keys, "acc_91d0be")
    # product_change (basic -> pro) is older than billing_issue, and not in effect yet anyway
    assert post_revenuecat(client, fixture("revenuecat", "product_change")).json["status"] == "ignored"
    assert state(client, keys, "acc_91d0be") == FREE
    assert post_revenuecat(client, fixture("revenuecat", "billing_issue")).json["status"] == "applied"
    assert state(client, keys, "acc_91d0be") == ("basic", "past_due", 100, "plan")
    note = inbox(conn)[0]["note"]
    assert "pro:monthly" in note and "not be in effect" in note


def test_revenuecat_transfer_moves_the_subscription(client: Any, keys: Any, conn: Any) -> None:
    for a in ("acc_7f3c21", "acc_c0ffee"):
        create_account(client, keys, a)
    post_revenuecat(client, fixture("revenuecat", "renewal"))
    assert state(client, keys, "acc_7f3c21") == ("pro", "active", 500, "plan")
    r = post_revenuecat(client, fixture("revenuecat", "transfer"))
    assert (r.status_code, r.json["status"]) == (200, "applied")
    assert state(client, keys, "acc_c0ffee") == ("pro", "active", 500, "plan")
    assert state(client, keys, "acc_7f3c21") == ("pro", "expired", 50, "free_fallback")
    # an older event naming the source (delivered late) does not move it back
    assert post_revenuecat(client, fixture("revenuecat", "cancellation")).json["status"] == "ignored"
    assert state(client, keys, "acc_c0ffee") == ("pro", "active", 500, "plan")
    assert state(client, keys, "acc_7f3c21") == ("pro", "expired", 50, "free_fallback")


def test_revenuecat_transfer_to_unknown_account_is_unmatched(client: Any, keys: Any, conn: Any) -> None:
    create_account(client, keys, "acc_7f3c21")
    post_revenuecat(client, fixture("revenuecat", "renewal"))
    assert post_revenuecat(client, fixture("revenuecat", "transfer")).json["status"] == "unmatched"
    assert state(client, keys, "acc_7f3c21") == ("pro", "active", 500, "plan")


def test_revenuecat_alias_names_the_account(client: Any, keys: Any) -> None:
    create_account(client, keys, "acc_7f3c21")
    event = revenuecat_event("initial_purchase", app_user_id="$RCAnonymousID:unknown")
    assert post_revenuecat(client, event).json["status"] == "applied"
    assert state(client, keys, "acc_7f3c21") == ("pro", "active", 500, "plan")


def test_revenuecat_trial_and_billing_error_cancellation(client: Any, keys: Any) -> None:
    create_account(client, keys, "acc_7f3c21")
    post_revenuecat(client, revenuecat_event("initial_purchase", period_type="TRIAL"))
    assert state(client, keys, "acc_7f3c21") == ("pro", "trialing", 500, "plan")
    post_revenuecat(client, revenuecat_event("cancellation"))  # UNSUBSCRIBE: keeps trialing
    assert state(client, keys, "acc_7f3c21") == ("pro", "trialing", 500, "plan")
    at = fixture("revenuecat", "cancellation")["event"]["event_timestamp_ms"] + 1
    post_revenuecat(
        client, revenuecat_event("cancellation", event_id="c2", at_ms=at, cancel_reason="BILLING_ERROR")
    )
    assert state(client, keys, "acc_7f3c21") == ("pro", "past_due", 500, "plan")


def test_revenuecat_paused_keeps_access(client: Any, keys: Any) -> None:
    create_account(client, keys, "acc_7f3c21")
    post_revenuecat(client, fixture("revenuecat", "initial_purchase"))
    at = fixture("revenuecat", "initial_purchase")["event"]["event_timestamp_ms"] + 1000
    r = post_revenuecat(
        client, revenuecat_event("renewal", event_id="p1", at_ms=at, type="SUBSCRIPTION_PAUSED")
    )
    assert r.json["status"] == "applied"
    assert state(client, keys, "acc_7f3c21") == ("pro", "active", 500, "plan")


@pytest.mark.parametrize(
    ("provider", "payload"),
    [
        (
            "revenuecat",
            {"api_version": "1.0", "event": {"id": "t-1", "type": "TEST", "event_timestamp_ms": 1}},
        ),
        ("revenuecat", {"event": {"id": "n-1", "type": "SOMETHING_NEW", "event_timestamp_ms": 1}}),
        (
            "stripe",
            {"id": "evt_new", "object": "event", "type": "customer.created", "created": 1, "data": {}},
        ),
        (
            "stripe",
            {"id": "evt_tw", "object": "event", "type": "customer.subscription.trial_will_end", "created": 1},
        ),
    ],
)
def test_unknown_and_test_types_are_stored_as_ignored(
    client: Any, conn: Any, provider: str, payload: Any
) -> None:
    post = post_stripe if provider == "stripe" else post_revenuecat
    r = post(client, payload)
    assert (r.status_code, r.json["status"]) == (200, "ignored")
    [row] = inbox(conn)
    assert (row["event_id"], row["status"]) == (payload.get("id") or payload["event"]["id"], "ignored")


def test_unmapped_price_keeps_the_plan_and_is_recorded(client: Any, keys: Any, conn: Any, acc: str) -> None:
    from tests.webhooks.helpers import now, stripe_subscription_event

    post_stripe(client, stripe_subscription_event(event_id="e1", created=now() - 10, price="basic_monthly"))
    assert state(client, keys, acc) == ("basic", "active", 100, "plan")
    r = post_stripe(
        client,
        stripe_subscription_event(event_id="e2", created=now(), price="enterprise_x", status="past_due"),
    )
    assert r.json["status"] == "applied"
    assert state(client, keys, acc) == ("basic", "past_due", 100, "plan")
    note = inbox(conn)[1]["note"]
    assert "enterprise_x" in note and "no plan" in note


def test_subscription_resolved_through_product_linked_customer(client: Any, keys: Any, conn: Any) -> None:
    create_account(client, keys, "acc_linked", stripe_customer_id=CUSTOMER)
    event = fixture("stripe", "customer.subscription.updated")
    event["data"]["object"]["metadata"] = {}
    assert post_stripe(client, event).json["status"] == "applied"
    assert state(client, keys, "acc_linked") == ("pro", "active", 500, "plan")


def test_subscription_resolved_through_checkout_link(client: Any, keys: Any, conn: Any, acc: str) -> None:
    post_stripe(client, fixture("stripe", "checkout.session.completed"))
    event = fixture("stripe", "customer.subscription.updated")
    event["data"]["object"]["metadata"] = {}
    assert post_stripe(client, event).json["status"] == "applied"
    assert state(client, keys, STRIPE_ACCOUNT) == ("pro", "active", 500, "plan")


def test_override_survives_webhooks(client: Any, keys: Any, acc: str) -> None:
    r = client.put(f"/v1/admin/accounts/{acc}/overrides/urls", json={"limit": 7}, headers=keys["admin"])
    assert r.status_code == 200, r.json
    post_stripe(client, fixture("stripe", "customer.subscription.updated"))
    assert state(client, keys, acc) == ("pro", "active", 7, "override")
    post_stripe(client, fixture("stripe", "customer.subscription.deleted"))
    assert state(client, keys, acc) == ("pro", "canceled", 7, "override")
    client.delete(f"/v1/admin/accounts/{acc}/overrides/urls", headers=keys["admin"])
    assert state(client, keys, acc) == ("pro", "canceled", 50, "free_fallback")


def test_features_follow_the_tier_and_an_override_survives_webhooks(client: Any, keys: Any, acc: str) -> None:
    """A webhook changes tier and status only: the plan's features follow them, an override stays."""

    def features() -> dict[str, tuple[bool, str]]:
        view = account(client, keys, acc)["features"]
        return {f: (s["enabled"], s["source"]) for f, s in view.items() if f in ("custom_domains", "sso")}

    r = client.put(f"/v1/admin/accounts/{acc}/features/sso", json={"enabled": True}, headers=keys["admin"])
    assert r.status_code == 200, r.json
    post_stripe(client, fixture("stripe", "customer.subscription.updated"))
    assert features() == {"custom_domains": (True, "plan"), "sso": (True, "override")}
    post_stripe(client, fixture("stripe", "customer.subscription.deleted"))
    assert features() == {"custom_domains": (False, "free_fallback"), "sso": (True, "override")}
    client.delete(f"/v1/admin/accounts/{acc}/features/sso", headers=keys["admin"])
    assert features() == {"custom_domains": (False, "free_fallback"), "sso": (False, "free_fallback")}


def test_stripe_unknown_status_is_stored_failed_and_acknowledged(
    client: Any, keys: Any, conn: Any, acc: str
) -> None:
    event = fixture("stripe", "customer.subscription.updated")
    event["data"]["object"]["status"] = "levitating"
    r = post_stripe(client, event)
    assert (r.status_code, r.json["status"]) == (200, "failed")
    [row] = inbox(conn)
    assert row["status"] == "failed" and "levitating" in row["error"]
    assert state(client, keys, acc) == FREE
    assert conn.execute("SELECT count(*) FROM subscriptions").fetchone() == (0,)

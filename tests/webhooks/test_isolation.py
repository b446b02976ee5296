"""Only tier and status change: a burst of every event type leaves usage counters, the ledger and
overrides byte-identical."""

from __future__ import annotations

from typing import Any

from tests.webhooks.helpers import (
    create_account,
    fixture,
    inbox,
    post_revenuecat,
    post_stripe,
    revenuecat_event,
    revenuecat_fixtures,
    state,
    stripe_fixtures,
    stripe_subscription_event,
)

ACCOUNTS = ("acc_7f3c21", "acc_91d0be", "acc_c0ffee", "acc_bystander")


def snapshot(conn: Any) -> tuple[list[Any], list[Any]]:
    quotas = conn.execute(
        "SELECT account_id, metric, period, used, override_set, override_limit FROM quotas ORDER BY 1, 2"
    ).fetchall()
    ledger = conn.execute("SELECT l::text FROM ledger l ORDER BY id").fetchall()
    return quotas, ledger


def test_burst_of_every_event_type_touches_no_usage_ledger_or_override(
    client: Any, keys: Any, conn: Any
) -> None:
    for a in ACCOUNTS:
        create_account(client, keys, a)
        for metric, units in (("urls", 3), ("seats", 1), ("api_calls", 7)):
            r = client.post(
                f"/v1/accounts/{a}/takes", json={"metric": metric, "units": units}, headers=keys["product"]
            )
            assert r.status_code == 201, r.json
    taken = client.post(
        "/v1/accounts/acc_7f3c21/takes", json={"metric": "urls"}, headers=keys["product"]
    ).json
    client.post(f"/v1/takes/{taken['take_id']}/release", headers=keys["product"])
    client.put("/v1/admin/accounts/acc_7f3c21/overrides/seats", json={"limit": 9}, headers=keys["admin"])
    client.put("/v1/admin/accounts/acc_91d0be/overrides/urls", json={"limit": None}, headers=keys["admin"])
    before = snapshot(conn)
    assert len(before[1]) == 14

    t = 1_790_000_000
    statuses = ["trialing", "active", "past_due", "unpaid", "incomplete", "incomplete_expired", "paused"]
    stripe_types = ["created", "updated", "paused", "resumed"]
    for i, status in enumerate(statuses):
        post_stripe(
            client,
            stripe_subscription_event(
                event_id=f"burst_{i}",
                created=t + i,
                status=status,
                type_=f"customer.subscription.{stripe_types[i % 4]}",
            ),
        )
    for name in stripe_fixtures():
        post_stripe(client, fixture("stripe", name))
        post_stripe(client, fixture("stripe", name))  # duplicate
    paid = fixture("stripe", "invoice.payment_failed")
    paid.update(id="evt_paid", type="invoice.paid")
    post_stripe(client, paid)
    post_stripe(
        client, {"id": "evt_other", "object": "event", "type": "charge.succeeded", "created": t, "data": {}}
    )

    rc_types = [
        "TEST",
        "UNCANCELLATION",
        "SUBSCRIPTION_EXTENDED",
        "NON_RENEWING_PURCHASE",
        "TEMPORARY_ENTITLEMENT_GRANT",
        "REFUND_REVERSED",
        "SUBSCRIPTION_PAUSED",
        "INVOICE_ISSUANCE",
        "VIRTUAL_CURRENCY_TRANSACTION",
        "EXPERIMENT_ENROLLMENT",
        "SUBSCRIBER_ALIAS",
        "SOMETHING_NEW",
    ]
    for i, type_ in enumerate(rc_types):
        post_revenuecat(client, revenuecat_event("renewal", event_id=f"rc_{i}", type=type_))
    for name in revenuecat_fixtures():
        post_revenuecat(client, fixture("revenuecat", name))
        post_revenuecat(client, fixture("revenuecat", name))  # duplicate
    for row in inbox(conn):  # and a replay of everything
        assert client.post(f"/v1/admin/events/{row['id']}/replay", headers=keys["admin"]).status_code == 200

    assert snapshot(conn) == before
    # the burst did change tiers and statuses
    assert state(client, keys, "acc_7f3c21")[:2] == ("pro", "expired")  # RC expiration is the newest
    assert state(client, keys, "acc_91d0be")[:2] == ("basic", "past_due")
    assert state(client, keys, "acc_bystander")[:2] == ("free", "none")
    assert {row["status"] for row in inbox(conn)} == {"applied", "ignored"}

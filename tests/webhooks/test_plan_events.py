"""account.plan_changed (issue 26, docs/events.md): written by the delivery that changed the
account's tier or status, in its transaction, with the cause; nothing when nothing changed (a
redelivery). From the providers' own payloads with ids and times substituted."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from service.billing import expiry
from tests.webhooks.helpers import create_account, post_revenuecat, post_stripe, stripe_subscription_event
from tests.webhooks.test_providers import ms, now, rc_sample


def plan_changes(conn: Any, account_id: str) -> list[tuple[Any, Any, str]]:
    rows = conn.execute(
        "SELECT data FROM event_outbox WHERE account_id = %s AND type = 'account.plan_changed' ORDER BY id",
        (account_id,),
    ).fetchall()
    return [(d["previous"], d["current"], d["cause"]) for (d,) in rows]


def test_a_stripe_subscription_changes_the_plan_once_per_change(client: Any, keys: Any, conn: Any) -> None:
    create_account(client, keys, "acc_ev1")
    t = int(time.time()) - 600
    active = stripe_subscription_event(event_id="evt_ev1_a", created=t, account_id="acc_ev1")
    assert post_stripe(client, active).status_code == 200
    assert post_stripe(client, active).status_code == 200  # redelivered: nothing changes, no event
    canceled = stripe_subscription_event(
        event_id="evt_ev1_b",
        created=t + 60,
        status="canceled",
        account_id="acc_ev1",
        type_="customer.subscription.deleted",
    )
    assert post_stripe(client, canceled).status_code == 200
    assert plan_changes(conn, "acc_ev1") == [
        ({"plan": "free", "status": "none"}, {"plan": "pro", "status": "active"}, "stripe"),
        ({"plan": "pro", "status": "active"}, {"plan": "pro", "status": "canceled"}, "stripe"),
    ]
    [(data,)] = conn.execute(
        "SELECT data FROM event_outbox WHERE account_id = 'acc_ev1' ORDER BY id LIMIT 1"
    ).fetchall()
    assert set(data) == {"account_id", "previous", "current", "cause", "occurred_at"}
    assert data["account_id"] == "acc_ev1"


def test_revenuecat_purchase_then_the_expiry_job(client: Any, keys: Any, conn: Any, plans: Any) -> None:
    create_account(client, keys, "acc_ev2")
    at = now() - timedelta(minutes=5)
    week = rc_sample(
        "non_renewing_purchase",
        event_id="rc-ev2",
        at=at,
        app_user_id="acc_ev2",
        original_app_user_id="$RCAnonymousID:ev2",
        aliases=[],
        transaction_id="900000000000092",
        original_transaction_id="900000000000092",
        expiration_at_ms=ms(at + timedelta(days=7)),
    )
    assert post_revenuecat(client, week).json["status"] == "applied"
    expiry.end_expired(conn, plans, at=at + timedelta(days=8))
    assert plan_changes(conn, "acc_ev2") == [
        ({"plan": "free", "status": "none"}, {"plan": "pro", "status": "active"}, "revenuecat"),
        ({"plan": "pro", "status": "active"}, {"plan": "pro", "status": "expired"}, "expiry"),
    ]


def test_a_plan_change_rearms_the_counters_for_the_new_plans_thresholds(
    client: Any, keys: Any, conn: Any
) -> None:
    create_account(client, keys, "acc_ev3")
    t = int(time.time()) - 600
    post_stripe(client, stripe_subscription_event(event_id="evt_ev3_a", created=t, account_id="acc_ev3"))

    def take(units: int) -> None:
        r = client.post(
            "/v1/accounts/acc_ev3/takes", json={"metric": "urls", "units": units}, headers=keys["product"]
        )
        assert r.status_code == 201, r.json

    take(300)  # 60 % of pro's 500: the counter's line moves to pro's next threshold, 80
    conn.execute("UPDATE plan_thresholds SET thresholds = '{50,100}' WHERE plan = 'pro'")
    try:
        take(1)  # the line is still 80: nothing yet
        past_due = stripe_subscription_event(
            event_id="evt_ev3_b", created=t + 60, status="past_due", account_id="acc_ev3"
        )
        post_stripe(client, past_due)  # the status changes: the line is looked at again
        take(1)
    finally:
        conn.execute("UPDATE plan_thresholds SET thresholds = '{80,100}' WHERE plan = 'pro'")
    fired = conn.execute(
        "SELECT data->>'threshold', data->>'used' FROM event_outbox"
        " WHERE account_id = 'acc_ev3' AND type = 'quota.threshold_crossed'"
    ).fetchall()
    assert fired == [("50", "302")]

"""Events out from end to end: real operations through the API (takes, a grant and its void, a
Stripe subscription from the provider's own payload) produce their events in their transactions,
and one relay run delivers every type to a real local receiver, signed so that the
`standardwebhooks` package accepts it. Nothing here writes event_outbox by hand."""

from __future__ import annotations

import time
from typing import Any

from standardwebhooks import Webhook

from service.events.relay import Relay
from tests.events.helpers import add_endpoint
from tests.webhooks.helpers import create_account, post_stripe, stripe_subscription_event

ACCOUNT = "acc_e2e"


def test_every_event_type_from_real_operations_is_delivered_signed(
    client: Any, keys: Any, conn: Any, relay_settings: Any, receiver: Any
) -> None:
    endpoint = add_endpoint(conn, receiver.url)
    create_account(client, keys, ACCOUNT)  # free: urls limit 50 (tests/plans.toml)
    assert (
        post_stripe(
            client,
            stripe_subscription_event(event_id="evt_e2e", created=int(time.time()) - 60, account_id=ACCOUNT),
        ).status_code
        == 200
    )  # now pro: urls limit 500
    take = client.post(
        f"/v1/accounts/{ACCOUNT}/takes", json={"metric": "urls", "units": 400}, headers=keys["product"]
    )
    assert take.status_code == 201, take.json
    grant = client.post(
        f"/v1/admin/accounts/{ACCOUNT}/grants",
        json={"metric": "urls", "units": 20, "idempotency_key": "e2e-1"},
        headers=keys["admin"],
    )
    assert grant.status_code == 201, grant.json
    void = client.post(f"/v1/admin/grants/{grant.json['grant_id']}/void", headers=keys["admin"])
    assert void.status_code == 200, void.json

    stats = Relay(relay_settings, workers=2, poll=0.05).once()

    assert stats.delivered == 4
    got = {}
    for headers, body in receiver.requests:
        payload = Webhook(endpoint.secret).verify(body, headers)  # raises unless signed with the secret
        data = dict(payload["data"])
        assert data.pop("occurred_at").endswith("Z")
        got[payload["type"]] = data
    grant_id = grant.json["grant_id"]
    assert got == {
        "account.plan_changed": {
            "account_id": ACCOUNT,
            "previous": {"plan": "free", "status": "none"},
            "current": {"plan": "pro", "status": "active"},
            "cause": "stripe",
        },
        "quota.threshold_crossed": {
            "account_id": ACCOUNT,
            "metric": "urls",
            "period": take.json["period"],
            "threshold": 80,
            "used": 400,
            "limit": 500,
        },
        "credits.granted": {
            "account_id": ACCOUNT,
            "metric": "urls",
            "grant_id": grant_id,
            "units": 20,
            "source": "admin",
            "expires_at": None,
        },
        "credits.voided": {
            "account_id": ACCOUNT,
            "metric": "urls",
            "grant_id": grant_id,
            "units": 20,
            "remaining": 0,
        },
    }
    assert len({h["webhook-id"] for h, _ in receiver.requests}) == 4

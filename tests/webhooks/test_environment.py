"""WEBHOOK_ENVIRONMENT: a deployment that takes only production (or only sandbox) events stores the
other environment's events as ignored and changes nothing for them, on delivery and on replay.
Unset, both are applied (the vendored fixtures mix Stripe test mode with RevenueCat production)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from service.config import Settings
from tests.conftest import running_app
from tests.webhooks.helpers import (
    STRIPE_ACCOUNT,
    create_account,
    inbox,
    now,
    post_revenuecat,
    post_stripe,
    revenuecat_event,
    state,
    stripe_subscription_event,
)

FREE = ("free", "none", 50, "plan")
PRO = ("pro", "active", 500, "plan")


@pytest.fixture
def production_client(settings: Settings) -> Iterator[Any]:
    with running_app(dataclasses.replace(settings, webhook_environment="production")) as app:
        yield app.test_client()


def stripe_event(event_id: str, *, livemode: bool) -> dict[str, Any]:
    event = stripe_subscription_event(event_id=event_id, created=now())
    event["livemode"] = livemode
    return event


def test_production_deployment_ignores_test_mode_stripe_events(
    production_client: Any, keys: Any, conn: Any
) -> None:
    create_account(production_client, keys, STRIPE_ACCOUNT)

    r = post_stripe(production_client, stripe_event("evt_test_mode", livemode=False))
    assert (r.status_code, r.json["status"]) == (200, "ignored")
    [row] = inbox(conn)
    assert "sandbox event" in row["note"] and "WEBHOOK_ENVIRONMENT" in row["note"]
    assert state(production_client, keys, STRIPE_ACCOUNT) == FREE
    assert conn.execute("SELECT count(*) FROM subscriptions").fetchone() == (0,)

    r = post_stripe(production_client, stripe_event("evt_live_mode", livemode=True))
    assert (r.status_code, r.json["status"]) == (200, "applied")
    assert state(production_client, keys, STRIPE_ACCOUNT) == PRO


def test_production_deployment_ignores_sandbox_revenuecat_events(
    production_client: Any, keys: Any, conn: Any
) -> None:
    user = revenuecat_event("initial_purchase")["event"]["app_user_id"]
    create_account(production_client, keys, user)

    sandbox = revenuecat_event("initial_purchase", event_id="rc-sandbox", environment="SANDBOX")
    assert post_revenuecat(production_client, sandbox).json["status"] == "ignored"
    unnamed = revenuecat_event("initial_purchase", event_id="rc-unnamed", environment=None)
    assert post_revenuecat(production_client, unnamed).json["status"] == "ignored"
    assert state(production_client, keys, user)[:2] == ("free", "none")

    production = revenuecat_event("initial_purchase", event_id="rc-production")
    assert post_revenuecat(production_client, production).json["status"] == "applied"
    assert state(production_client, keys, user)[1] == "active"


def test_a_replay_follows_the_setting_in_force(
    client: Any, production_client: Any, keys: Any, conn: Any
) -> None:
    create_account(production_client, keys, STRIPE_ACCOUNT)
    r = post_stripe(production_client, stripe_event("evt_test_mode", livemode=False))
    assert r.json["status"] == "ignored"

    # replayed on the production deployment: still ignored
    again = production_client.post(f"/v1/admin/events/{r.json['id']}/replay", headers=keys["admin"])
    assert (again.status_code, again.json["status"]) == (200, "ignored")
    assert state(production_client, keys, STRIPE_ACCOUNT) == FREE

    # replayed where the setting is unset: applied
    applied = client.post(f"/v1/admin/events/{r.json['id']}/replay", headers=keys["admin"])
    assert (applied.status_code, applied.json["status"]) == (200, "applied")
    assert state(client, keys, STRIPE_ACCOUNT) == PRO


def test_unset_applies_both_environments(client: Any, keys: Any) -> None:
    create_account(client, keys, STRIPE_ACCOUNT)
    assert post_stripe(client, stripe_event("evt_test_mode", livemode=False)).json["status"] == "applied"
    assert state(client, keys, STRIPE_ACCOUNT) == PRO


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", None), ("production", "production"), (" Sandbox ", "sandbox")],
)
def test_the_setting_is_read_from_the_environment(value: str, expected: str | None) -> None:
    env = {"DATABASE_URL": "postgresql://x/y", "WEBHOOK_ENVIRONMENT": value}
    assert Settings.from_env(env).webhook_environment == expected


def test_an_unknown_setting_is_refused_at_start() -> None:
    with pytest.raises(RuntimeError, match="WEBHOOK_ENVIRONMENT"):
        Settings.from_env({"DATABASE_URL": "postgresql://x/y", "WEBHOOK_ENVIRONMENT": "live"})

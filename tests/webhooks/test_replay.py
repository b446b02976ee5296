"""Unmatched events are stored, listed, and applied by an admin replay once the account exists.
A verified event never creates an account."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webhooks.helpers import (
    create_account,
    fixture,
    inbox,
    post_revenuecat,
    post_stripe,
    state,
    stripe_subscription_event,
)


def events(client: Any, keys: Any, **query: Any) -> dict[str, Any]:
    r = client.get("/v1/admin/events", query_string=query, headers=keys["admin"])
    assert r.status_code == 200, r.json
    return r.json


def replay(client: Any, keys: Any, inbox_id: Any, role: str = "admin") -> Any:
    return client.post(f"/v1/admin/events/{inbox_id}/replay", headers=keys[role])


def test_unmatched_stripe_event_then_replay(client: Any, keys: Any, conn: Any) -> None:
    r = post_stripe(client, fixture("stripe", "customer.subscription.updated"))
    assert (r.status_code, r.json["status"]) == (200, "unmatched")
    assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (0,)  # no account was created
    [item] = events(client, keys, status="unmatched")["items"]
    assert item["id"] == r.json["id"] and item["event_id"] == "evt_1RmUpg8Lt4dXK03v5QwErTyU"
    assert set(item) >= {"id", "provider", "event_id", "type", "status", "error", "received_at"}
    assert "acc_7f3c21" in item["note"]

    # replay before the account exists: still unmatched, attempts counted
    again = replay(client, keys, item["id"])
    assert (again.status_code, again.json["status"], again.json["attempts"]) == (200, "unmatched", 2)

    # creating the account applies it at once (a replay by the link), no admin needed
    create_account(client, keys, "acc_7f3c21")
    done = conn.execute("SELECT status, account_id, attempts FROM webhook_events").fetchall()
    assert done == [("applied", "acc_7f3c21", 3)]
    assert state(client, keys, "acc_7f3c21") == ("pro", "active", 500, "plan")
    assert events(client, keys, status="unmatched")["items"] == []
    actors = conn.execute(
        "SELECT DISTINCT actor FROM audit_log"
        " WHERE account_id = 'acc_7f3c21' AND action = 'plan_limit_changed'"
    ).fetchall()
    assert actors == [("replay:link:stripe:evt_1RmUpg8Lt4dXK03v5QwErTyU",)]

    # an admin replay now re-applies the same state: nothing changes
    again = replay(client, keys, item["id"])
    assert (again.json["status"], again.json["attempts"]) == ("applied", 4)
    assert state(client, keys, "acc_7f3c21") == ("pro", "active", 500, "plan")
    replays = conn.execute(
        "SELECT actor, new->>'status' FROM audit_log WHERE action = 'event_replayed' ORDER BY id"
    ).fetchall()
    assert replays == [("test-admin", "unmatched"), ("link", "applied"), ("test-admin", "applied")]


def test_unmatched_revenuecat_events_replayed_in_any_order(client: Any, keys: Any, conn: Any) -> None:
    """Replays follow the ordering rule: replaying an older event after a newer one changes nothing."""
    ids = {}
    for name in ("initial_purchase", "expiration", "cancellation"):
        r = post_revenuecat(client, fixture("revenuecat", name))
        assert r.json["status"] == "unmatched"
        ids[name] = r.json["id"]
    create_account(client, keys, "acc_7f3c21")
    assert replay(client, keys, ids["expiration"]).json["status"] == "applied"
    assert replay(client, keys, ids["initial_purchase"]).json["status"] == "ignored"
    assert replay(client, keys, ids["cancellation"]).json["status"] == "ignored"
    assert state(client, keys, "acc_7f3c21") == ("pro", "expired", 50, "free_fallback")


def test_replay_of_an_applied_event_changes_nothing(client: Any, keys: Any, conn: Any) -> None:
    create_account(client, keys, "acc_7f3c21")
    r = post_stripe(client, fixture("stripe", "customer.subscription.updated"))
    changes = "SELECT count(*) FROM audit_log WHERE action <> 'event_replayed'"
    audit = conn.execute(changes).fetchone()
    assert replay(client, keys, r.json["id"]).json["status"] == "applied"
    assert conn.execute(changes).fetchone() == audit  # the replay itself is audited, nothing else
    assert conn.execute("SELECT count(*) FROM audit_log WHERE action = 'event_replayed'").fetchone() == (1,)
    assert state(client, keys, "acc_7f3c21") == ("pro", "active", 500, "plan")


def test_replay_of_a_failed_event_stays_failed(client: Any, keys: Any, conn: Any) -> None:
    create_account(client, keys, "acc_7f3c21")
    event = fixture("stripe", "customer.subscription.updated")
    event["data"]["object"]["status"] = "mystery"
    r = post_stripe(client, event)
    assert r.json["status"] == "failed"
    again = replay(client, keys, r.json["id"])
    assert (again.json["status"], again.json["error"]) == ("failed", "unknown subscription status 'mystery'")


@pytest.mark.parametrize("inbox_id", ["999999", "abc", "-1", "1" * 30])
def test_replay_unknown_event_is_404(client: Any, keys: Any, inbox_id: str) -> None:
    r = replay(client, keys, inbox_id)
    assert r.status_code == 404 and r.json["error"] == "unknown_event"


@pytest.mark.parametrize("role", ["product", "finance"])
def test_replay_and_list_need_admin(client: Any, keys: Any, role: str) -> None:
    assert replay(client, keys, 1, role=role).status_code == 403
    assert client.get("/v1/admin/events", headers=keys[role]).status_code == 403
    assert client.get("/v1/admin/events").status_code == 401


def test_events_page_filters_and_cursor(client: Any, keys: Any, conn: Any) -> None:
    create_account(client, keys, "acc_7f3c21")
    post_revenuecat(client, fixture("revenuecat", "initial_purchase"))  # applied
    post_revenuecat(client, fixture("revenuecat", "billing_issue"))  # unmatched (acc_91d0be)
    for i in range(5):
        post_stripe(
            client, stripe_subscription_event(event_id=f"evt_{i}", created=1_790_000_000 + i)
        )  # applied
    post_stripe(
        client, {"id": "evt_ign", "object": "event", "type": "charge.succeeded", "created": 1}
    )  # ignored

    everything = events(client, keys, limit=100)
    assert len(everything["items"]) == 8 and everything["next_cursor"] is None
    ids = [e["id"] for e in everything["items"]]
    assert ids == sorted(ids)

    page1 = events(client, keys, limit=3)
    assert [e["id"] for e in page1["items"]] == ids[:3]
    page2 = events(client, keys, limit=3, cursor=page1["next_cursor"])
    assert [e["id"] for e in page2["items"]] == ids[3:6]
    page3 = events(client, keys, limit=3, cursor=page2["next_cursor"])
    assert [e["id"] for e in page3["items"]] == ids[6:] and page3["next_cursor"] is None

    assert [e["provider"] for e in events(client, keys, provider="revenuecat")["items"]] == ["revenuecat"] * 2
    assert [e["event_id"] for e in events(client, keys, status="ignored")["items"]] == ["evt_ign"]
    assert [e["type"] for e in events(client, keys, status="unmatched", provider="revenuecat")["items"]] == [
        "BILLING_ISSUE"
    ]
    assert events(client, keys, status="unmatched", provider="stripe")["items"] == []


@pytest.mark.parametrize(
    "query", [{"status": "duplicate"}, {"provider": "paddle"}, {"limit": 0}, {"cursor": "x"}, {"surprise": 1}]
)
def test_events_page_bad_query_is_422(client: Any, keys: Any, query: dict[str, Any]) -> None:
    r = client.get("/v1/admin/events", query_string=query, headers=keys["admin"])
    assert r.status_code == 422 and r.json["error"] == "validation_failed"


def test_events_are_in_the_openapi_document(client: Any) -> None:
    paths = client.get("/openapi.json").json["paths"]
    assert "get" in paths["/v1/admin/events"]
    assert "post" in paths["/v1/admin/events/{inbox_id}/replay"]


def test_duplicate_delivery_answers_with_the_stored_row(client: Any, keys: Any, conn: Any) -> None:
    create_account(client, keys, "acc_7f3c21")
    first = post_revenuecat(client, fixture("revenuecat", "initial_purchase"))
    second = post_revenuecat(client, fixture("revenuecat", "initial_purchase"))
    assert second.json == {**first.json, "duplicate": True}
    assert len(inbox(conn)) == 1

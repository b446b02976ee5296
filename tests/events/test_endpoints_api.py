"""The admin routes of events out: endpoints (audited; the secret shown once) and deliveries."""

from __future__ import annotations

import base64

import pytest
from standardwebhooks import Webhook

from service.events import outbox
from tests.events.helpers import emit
from tests.http.conftest import assert_error

URL = "https://93.184.216.34/hooks"  # a public address: no lookup needed
BASE = "/v1/admin/webhook-endpoints"


def create(client, keys, url=URL, events=("quota.threshold_crossed",)):
    return client.post(BASE, json={"url": url, "events": list(events)}, headers=keys["admin"])


def test_create_answers_the_secret_once_and_audits(client, keys, conn):
    r = create(
        client, keys, events=["quota.threshold_crossed", "account.plan_changed", "quota.threshold_crossed"]
    )
    assert r.status_code == 201, r.json
    body = r.json
    assert set(body) == {"id", "url", "events", "enabled", "secret", "previous_secret_until"}
    assert body["url"] == URL and body["enabled"] is True
    assert body["events"] == ["quota.threshold_crossed", "account.plan_changed"]
    assert body["id"].startswith("we_") and body["secret"].startswith("whsec_")
    assert len(base64.b64decode(body["secret"].removeprefix("whsec_"))) >= 24
    Webhook(body["secret"])  # a secret the package reads
    listed = client.get(BASE, headers=keys["admin"]).json["items"]
    assert [e["id"] for e in listed] == [body["id"]]
    assert "secret" not in listed[0] and body["secret"] not in str(listed)
    [(actor, account, new)] = conn.execute(
        "SELECT actor, account_id, new FROM audit_log WHERE action = 'webhook_endpoint_created'"
    ).fetchall()
    assert (actor, account, new) == (
        "test-admin",
        "",
        {"id": body["id"], "url": URL, "events": body["events"]},
    )


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://93.184.216.34/hooks", "scheme must be https"),
        ("https://localhost/hooks", "loopback"),
        ("https://127.0.0.1/hooks", "loopback"),
        ("https://10.1.2.3/hooks", "private"),
        ("https://169.254.169.254/latest", "link-local"),
        ("https://[::1]/hooks", "loopback"),
        ("https://[::ffff:127.0.0.1]/hooks", "loopback"),
        ("https://[::ffff:10.0.0.1]/hooks", "private"),
        ("not a url", "scheme"),
    ],
)
def test_a_refused_url_is_422_invalid_url_with_the_reason(client, keys, conn, url, reason):
    body = assert_error(create(client, keys, url=url), 422, "invalid_url")
    assert reason in body["reason"] and reason in body["message"]
    assert conn.execute("SELECT count(*) FROM webhook_endpoints").fetchone()[0] == 0


@pytest.mark.parametrize(
    "body",
    [
        {"url": URL, "events": ["quota.nope"]},
        {"url": URL, "events": []},
        {"url": URL, "events": "quota.threshold_crossed"},
        {"url": URL},
        {"events": ["credits.granted"]},
        {"url": 7, "events": ["credits.granted"]},
        {"url": "https://93.184.216.34/\u0000", "events": ["credits.granted"]},
        {"url": URL, "events": [None]},
        {"url": URL, "events": ["credits.granted"], "secret": "mine"},
        {"url": "https://93.184.216.34/" + "a" * 3000, "events": ["credits.granted"]},
    ],
)
def test_hostile_bodies_are_422(client, keys, body):
    assert_error(client.post(BASE, json=body, headers=keys["admin"]), 422, "validation_failed")


def test_a_body_that_is_not_json_is_400(client, keys):
    r = client.post(BASE, data="{", headers={**keys["admin"], "Content-Type": "application/json"})
    assert_error(r, 400, "invalid_json")


def test_delete_and_rotate(client, keys, conn):
    endpoint = create(client, keys).json
    path = f"{BASE}/{endpoint['id']}"
    r = client.post(f"{path}/rotate-secret", headers=keys["admin"])
    assert r.status_code == 200, r.json
    assert r.json["secret"].startswith("whsec_") and r.json["secret"] != endpoint["secret"]
    assert r.json["previous_secret_until"] is not None
    assert client.delete(path, headers=keys["admin"]).json == {"id": endpoint["id"], "deleted": True}
    assert client.delete(path, headers=keys["admin"]).status_code == 200  # again: the same answer
    assert client.get(BASE, headers=keys["admin"]).json["items"] == []
    assert_error(client.post(f"{path}/rotate-secret", headers=keys["admin"]), 404, "unknown_endpoint")
    actions = [
        r[0]
        for r in conn.execute(
            "SELECT action FROM audit_log WHERE action LIKE 'webhook_endpoint%%' ORDER BY id"
        ).fetchall()
    ]
    assert actions == [
        "webhook_endpoint_created",
        "webhook_endpoint_secret_rotated",
        "webhook_endpoint_deleted",
    ]
    audited = str(conn.execute("SELECT array_agg(old::text || new::text) FROM audit_log").fetchone()[0])
    assert endpoint["secret"] not in audited and r.json["secret"] not in audited


@pytest.mark.parametrize("endpoint_id", ["we_nothing", "nope", "we_%00", "x" * 300, "we_a%2Fb"])
def test_unknown_endpoints_are_404(client, keys, endpoint_id):
    for method, suffix in [("DELETE", ""), ("POST", "/rotate-secret"), ("GET", "/deliveries")]:
        r = client.open(f"{BASE}/{endpoint_id}{suffix}", method=method, headers=keys["admin"])
        assert r.status_code == 404, (method, suffix, r.json)


def test_deliveries_list_filter_page_and_retry(client, keys, conn):
    endpoint = create(client, keys).json
    events = [emit(conn) for _ in range(3)]
    outbox.fan_out(conn)
    conn.execute(
        "UPDATE webhook_deliveries SET status = 'delivered', attempts = 1, last_status = 200, "
        "finished_at = now() WHERE event_id = %s",
        (events[0],),
    )
    conn.execute(
        "UPDATE webhook_deliveries SET status = 'failed', attempts = 8, last_status = 500, "
        "last_error = 'answered 500', finished_at = now(), next_attempt_at = now() - interval '1 h' "
        "WHERE event_id = %s",
        (events[1],),
    )
    path = f"{BASE}/{endpoint['id']}/deliveries"
    page = client.get(path, headers=keys["admin"]).json
    assert [d["event_id"] for d in page["items"]] == events[::-1] and page["next_cursor"] is None
    first = client.get(path, query_string={"limit": 2}, headers=keys["admin"]).json
    assert len(first["items"]) == 2 and first["next_cursor"]
    rest = client.get(
        path, query_string={"limit": 2, "cursor": first["next_cursor"]}, headers=keys["admin"]
    ).json
    assert [d["event_id"] for d in rest["items"]] == [events[0]]
    failed = client.get(path, query_string={"status": "failed"}, headers=keys["admin"]).json["items"]
    assert [(d["event_id"], d["attempts"], d["last_status"], d["last_error"]) for d in failed] == [
        (events[1], 8, 500, "answered 500")
    ]
    assert set(failed[0]) == {
        "id", "event_id", "type", "status", "attempts", "last_status", "last_error", "next_attempt_at",
        "created_at", "finished_at",
    }  # fmt: skip
    assert_error(client.get(path, query_string={"status": "lost"}, headers=keys["admin"]), 422)
    assert_error(client.get(path, query_string={"limit": 0}, headers=keys["admin"]), 422)
    assert_error(client.get(path, query_string={"limit": 10**6}, headers=keys["admin"]), 422)
    # retry: failed -> pending, due now; delivered -> 409; unknown -> 404
    r = client.post(f"/v1/admin/webhook-deliveries/{failed[0]['id']}/retry", headers=keys["admin"])
    assert r.status_code == 200, r.json
    assert r.json["status"] == "pending" and r.json["finished_at"] is None
    due = conn.execute(
        "SELECT next_attempt_at <= now() FROM webhook_deliveries WHERE id = %s", (failed[0]["id"],)
    )
    assert due.fetchone()[0]
    delivered = page["items"][-1]["id"]
    assert_error(
        client.post(f"/v1/admin/webhook-deliveries/{delivered}/retry", headers=keys["admin"]),
        409,
        "already_delivered",
    )
    assert_error(
        client.post("/v1/admin/webhook-deliveries/999999/retry", headers=keys["admin"]),
        404,
        "unknown_delivery",
    )
    assert client.post("/v1/admin/webhook-deliveries/x/retry", headers=keys["admin"]).status_code == 404
    # an endpoint deleted: its waiting deliveries are failed, and a retry is refused
    assert client.delete(f"{BASE}/{endpoint['id']}", headers=keys["admin"]).status_code == 200
    assert client.get(path, query_string={"status": "pending"}, headers=keys["admin"]).json["items"] == []
    assert_error(
        client.post(f"/v1/admin/webhook-deliveries/{failed[0]['id']}/retry", headers=keys["admin"]),
        409,
        "endpoint_disabled",
    )


@pytest.mark.parametrize("role", ["product", "finance"])
def test_only_admin_keys(client, keys, role):
    assert_error(create(client, {"admin": keys[role]}), 403, "forbidden")
    assert_error(client.get(BASE, headers=keys[role]), 403, "forbidden")
    assert_error(client.post("/v1/admin/webhook-deliveries/1/retry", headers=keys[role]), 403, "forbidden")

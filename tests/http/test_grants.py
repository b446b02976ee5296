"""Credits through the API (issue 25): an admin's grant (201, the same key 200, audited), its void
(forward-only, the same answer again), the product's list, the account view's credits and
remaining, a take's from_credits. tests/plans.toml: free has urls 50."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.db.helpers import set_override
from tests.http.conftest import assert_error, take


def _grant(client, keys, account="acc-1", status=201, **body):
    r = client.post(
        f"/v1/admin/accounts/{account}/grants",
        json={"metric": "urls", "units": 5, "idempotency_key": "g-1", **body},
        headers=keys["admin"],
    )
    assert r.status_code == status, r.json
    return r.json


def test_a_grant_is_201_then_200_for_the_same_key_and_audited_once(client, keys, account, conn):
    expires = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)
    g = _grant(client, keys, expires_at=expires.isoformat(), note="sorry for the outage")
    assert {k: g[k] for k in ("metric", "units", "remaining", "source", "status")} == {
        "metric": "urls",
        "units": 5,
        "remaining": 5,
        "source": "admin",
        "status": "live",
    }
    assert datetime.fromisoformat(g["expires_at"]) == expires
    assert _grant(client, keys, status=200, expires_at=expires.isoformat()) == g
    assert_error(
        client.post(
            "/v1/admin/accounts/acc-1/grants",
            json={"metric": "urls", "units": 6, "idempotency_key": "g-1"},
            headers=keys["admin"],
        ),
        409,
        "idempotency_key_reused",
    )
    audit = conn.execute(
        "SELECT actor, new->>'units' FROM audit_log WHERE account_id = %s AND action = 'grant_created'",
        (account,),
    ).fetchall()
    assert audit == [("test-admin", "5")]


def test_grants_refuse_allocations_bad_bodies_and_the_product_role(client, keys, account):
    assert_error(
        client.post(
            "/v1/admin/accounts/acc-1/grants",
            json={"metric": "seats", "units": 1, "idempotency_key": "s"},
            headers=keys["admin"],
        ),
        422,
        "not_grantable",
    )
    for body in (
        {"metric": "urls", "units": 0, "idempotency_key": "k"},
        {"metric": "urls", "units": 1},
        {"metric": "urls", "units": 1, "idempotency_key": "k", "expires_at": "2030-01-01T00:00:00"},
    ):
        r = client.post("/v1/admin/accounts/acc-1/grants", json=body, headers=keys["admin"])
        assert_error(r, 422, "validation_failed")
    r = client.post(
        "/v1/admin/accounts/acc-1/grants",
        json={"metric": "urls", "units": 1, "idempotency_key": "k"},
        headers=keys["product"],
    )
    assert_error(r, 403, "forbidden")
    assert_error(client.post("/v1/admin/grants/999999/void", headers=keys["admin"]), 404, "unknown_grant")
    r = client.post(
        "/v1/admin/accounts/nobody/grants",
        json={"metric": "urls", "units": 1, "idempotency_key": "k"},
        headers=keys["admin"],
    )
    assert_error(r, 404, "unknown_account")


def test_a_take_past_the_allowance_draws_credits_and_the_view_counts_them(client, keys, account, conn):
    set_override(conn, account, "urls", 2)
    g = _grant(client, keys, units=5)
    view = client.get("/v1/accounts/acc-1", headers=keys["product"]).json["limits"]["urls"]
    assert (view["used"], view["limit"], view["credits"], view["remaining"]) == (0, 2, 5, 7)
    assert take(client, keys, units=2)["from_credits"] == 0
    t = take(client, keys, units=3)
    assert (t["units"], t["from_credits"], t["used"], t["limit"]) == (3, 3, 2, 2)
    view = client.get("/v1/accounts/acc-1", headers=keys["product"]).json["limits"]["urls"]
    assert (view["used"], view["credits"], view["remaining"]) == (2, 2, 2)
    check = client.get(
        "/v1/accounts/acc-1/check", query_string={"metric": "urls", "units": 2}, headers=keys["product"]
    ).json
    assert check["allowed"] is True
    assert_error(client.post("/v1/accounts/acc-1/takes", json={"metric": "urls", "units": 3},
                             headers=keys["product"]), 409, "quota_exhausted")  # fmt: skip

    listed = client.get("/v1/accounts/acc-1/grants", query_string={"metric": "urls"}, headers=keys["product"])
    assert [(x["grant_id"], x["remaining"], x["status"]) for x in listed.json["grants"]] == [
        (g["grant_id"], 2, "live")
    ]
    assert client.get("/v1/accounts/acc-1/grants?metric=api_calls", headers=keys["product"]).json == {
        "grants": []
    }

    v = client.post(f"/v1/admin/grants/{g['grant_id']}/void", headers=keys["admin"])
    assert (v.status_code, v.json) == (200, {"grant_id": g["grant_id"], "voided": 2, "used": 3})
    again = client.post(f"/v1/admin/grants/{g['grant_id']}/void", headers=keys["admin"])
    assert again.json == v.json
    view = client.get("/v1/accounts/acc-1", headers=keys["product"]).json["limits"]["urls"]
    assert (view["used"], view["credits"], view["remaining"]) == (2, 0, 0)
    listed = client.get("/v1/accounts/acc-1/grants", headers=keys["product"]).json["grants"]
    assert [(x["remaining"], x["status"]) for x in listed] == [(0, "voided")]
    # the take that drew on the voided grant: released, its grant share forfeited, the allowance's back
    r = client.post(f"/v1/accounts/acc-1/takes/{t['take_id']}/release", headers=keys["product"])
    assert r.status_code == 200 and r.json["units"] == 0
    assert_error(client.get("/v1/accounts/nobody/grants", headers=keys["product"]), 404, "unknown_account")


def test_an_expiry_at_the_edges_of_time_is_kept_within_them(client, keys, account):
    late = _grant(client, keys, idempotency_key="late", expires_at="9999-12-31T23:59:59-14:00")
    assert late["expires_at"].startswith("9999-12-30") and late["status"] == "live"
    early = _grant(client, keys, idempotency_key="early", expires_at="0001-01-01T00:00:00+14:00")
    assert early["status"] == "expired" and early["remaining"] == 0

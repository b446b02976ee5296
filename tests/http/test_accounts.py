"""PUT/GET /v1/accounts/{id}: create or update, the product view of limits, and bad input."""

from __future__ import annotations

from service.quota import periods
from tests.db.helpers import soft_delete
from tests.http.conftest import assert_error, put_account, take

PERIOD = periods.current_period()


def test_put_creates_then_updates(client, keys):
    r = client.put("/v1/accounts/acc-1", json={"kind": "user"}, headers=keys["product"])
    assert r.status_code == 201
    body = r.json
    assert (body["id"], body["kind"], body["plan"], body["subscription_status"]) == (
        "acc-1",
        "user",
        "free",
        "none",
    )

    r = client.put(
        "/v1/accounts/acc-1", json={"kind": "team", "stripe_customer_id": "cus_1"}, headers=keys["product"]
    )
    assert r.status_code == 200
    assert r.json["kind"] == "team"


def test_get_shows_effective_limits_and_usage_without_override_values(client, keys, account):
    take(client, keys, units=3)
    client.put(f"/v1/admin/accounts/{account}/overrides/seats", json={"limit": 9}, headers=keys["admin"])

    r = client.get(f"/v1/accounts/{account}", headers=keys["product"])

    assert r.status_code == 200
    limits = r.json["limits"]
    assert set(limits) == {"api_calls", "exports", "seats", "urls"}
    assert limits["urls"] == {
        "kind": "consumable",
        "reset": "month",
        "limit": 50,
        "limit_source": "plan",
        "used": 3,
        "credits": 0,
        "remaining": 47,
        "over_limit": False,
        "period": PERIOD,
        "resets_at": periods.resets_at(PERIOD),
    }
    assert limits["seats"]["limit"] == 9 and limits["seats"]["limit_source"] == "override"
    for m in limits.values():
        assert "override" not in m and "plan_limit" not in m
    assert r.json["deleted"] is False


def test_resets_at_is_the_first_of_next_month_utc(client, keys, account):
    resets_at = client.get(f"/v1/accounts/{account}", headers=keys["product"]).json["limits"]["urls"][
        "resets_at"
    ]
    assert resets_at == periods.period_start(periods.next_period(PERIOD)).strftime("%Y-%m-%dT00:00:00Z")


def test_unknown_account_is_404(client, keys):
    assert_error(client.get("/v1/accounts/nobody", headers=keys["product"]), 404, "unknown_account")


def test_a_deleted_account_says_so_and_refuses_takes(client, keys, account, conn):
    soft_delete(conn, account)
    r = client.get(f"/v1/accounts/{account}", headers=keys["product"])
    assert r.status_code == 200 and r.json["deleted"] is True
    assert "stripe_customer_id" not in r.json
    r = client.post(f"/v1/accounts/{account}/takes", json={"metric": "urls"}, headers=keys["product"])
    assert_error(r, 410, "account_deleted")


def test_the_account_schema_documents_deleted(client):
    schemas = client.get("/openapi.json").json["components"]["schemas"]
    assert schemas["Account"]["properties"]["deleted"]["type"] == "boolean"


def test_put_on_a_deleted_account_is_410(client, keys, account, conn):
    soft_delete(conn, account)
    r = client.put(f"/v1/accounts/{account}", json={"kind": "team"}, headers=keys["product"])
    assert_error(r, 410, "account_deleted")


def test_customer_linked_to_another_account_is_409(client, keys):
    put_account(client, keys, "a", stripe_customer_id="cus_X")
    r = client.put(
        "/v1/accounts/b", json={"kind": "user", "stripe_customer_id": "cus_X"}, headers=keys["product"]
    )
    assert_error(r, 409, "customer_already_linked")
    assert_error(client.get("/v1/accounts/b", headers=keys["product"]), 404)


def test_a_customer_its_account_moved_away_from_can_be_linked_again(client, keys, conn):
    """One account per customer (stripe_customers, migrations/0013): an account given another
    customer releases the one it named, in the same transaction; the one it names now stays its."""
    put_account(client, keys, "a", stripe_customer_id="cus_X")
    put_account(client, keys, "a", stripe_customer_id="cus_X")  # the same link again: still a's
    put_account(client, keys, "a", stripe_customer_id="cus_Y")
    r = client.put(
        "/v1/accounts/b", json={"kind": "user", "stripe_customer_id": "cus_X"}, headers=keys["product"]
    )
    assert r.status_code == 201
    r = client.put(
        "/v1/accounts/c", json={"kind": "user", "stripe_customer_id": "cus_Y"}, headers=keys["product"]
    )
    assert_error(r, 409, "customer_already_linked")
    claims = conn.execute("SELECT customer_id, account_id FROM stripe_customers ORDER BY 1").fetchall()
    assert claims == [("cus_X", "b"), ("cus_Y", "a")]


INVALID_PUTS = [
    ({}, "kind"),
    ({"kind": "robot"}, "kind"),
    ({"kind": 1}, "kind"),
    ({"kind": "user", "plan": "pro"}, "plan"),  # unknown fields are refused, not ignored
    ({"kind": "user", "stripe_customer_id": ""}, "stripe_customer_id"),
    ({"kind": "user", "stripe_customer_id": 5}, "stripe_customer_id"),
]


def test_put_validation_is_422_per_field(client, keys, subtests):
    for body, field in INVALID_PUTS:
        with subtests.test(body=body):
            r = client.put("/v1/accounts/acc-1", json=body, headers=keys["product"])
            err = assert_error(r, 422, "validation_failed")
            assert set(err["fields"]) == {field}
            assert all(isinstance(m, str) for m in err["fields"][field])
    assert_error(client.get("/v1/accounts/acc-1", headers=keys["product"]), 404)


def test_body_that_is_not_a_json_object_is_400(client, keys, subtests):
    for raw in ["", "not json", "[1, 2]", '"user"', "null", "3", '{"kind": "user"']:
        with subtests.test(raw=raw):
            r = client.put(
                "/v1/accounts/acc-1", data=raw, content_type="application/json", headers=keys["product"]
            )
            assert_error(r, 400)


def test_invalid_account_id_is_422(client, keys, subtests):
    for bad_id in ["a" * 129, "has space", "semi;colon", "ümlaut", "%00", "tab%09", "acc-1%0A", "%0A"]:
        for r in (
            client.put(f"/v1/accounts/{bad_id}", json={"kind": "user"}, headers=keys["product"]),
            client.get(f"/v1/accounts/{bad_id}", headers=keys["product"]),
            client.post(f"/v1/accounts/{bad_id}/takes", json={"metric": "urls"}, headers=keys["product"]),
            client.get(f"/v1/accounts/{bad_id}/usage?metric=urls", headers=keys["product"]),
            client.get(f"/v1/admin/accounts/{bad_id}", headers=keys["admin"]),
            client.put(
                f"/v1/admin/accounts/{bad_id}/overrides/urls", json={"limit": 1}, headers=keys["admin"]
            ),
        ):
            with subtests.test(id=bad_id, path=r.request.path, method=r.request.method):
                err = assert_error(r, 422, "validation_failed")
                assert "id" in err["fields"]


def test_longest_valid_account_id_and_every_allowed_character(client, keys):
    for account_id in ("a" * 128, "A-z_0.9:x@y"):
        assert (
            client.put(
                f"/v1/accounts/{account_id}", json={"kind": "user"}, headers=keys["product"]
            ).status_code
            == 201
        )
        take(client, keys, account_id)

"""POST /v1/accounts/{id}/takes and POST /v1/takes/{id}/release: the contract, every refusal, and
validation that refuses bad input before anything moves."""

from __future__ import annotations

from service.quota import periods
from tests.db.helpers import counter, ledger_rows, set_override, set_period, soft_delete
from tests.http.conftest import assert_error, take

PERIOD = periods.current_period()
MAX_UNITS = 2**31 - 1


def test_take_is_201_with_the_contracts_fields(client, keys, account, conn):
    body = take(client, keys, units=2)
    assert body == {
        "take_id": body["take_id"],
        "metric": "urls",
        "units": 2,
        "used": 2,
        "limit": 50,
        "remaining": 48,
        "period": PERIOD,
        "limit_source": "plan",
        "from_credits": 0,
    }
    row = ledger_rows(conn, account)[0]
    assert (row["id"], row["actor"], row["kind"]) == (body["take_id"], "test-product", "take")


def test_units_default_to_one(client, keys, account):
    assert take(client, keys)["units"] == 1


def test_same_idempotency_key_is_200_with_the_original(client, keys, account, conn):
    first = take(client, keys, units=2, idempotency_key="order-17")
    take(client, keys)
    again = take(client, keys, status=200, units=2, idempotency_key="order-17")
    assert again == first
    assert counter(conn, account, "urls")["used"] == 3


def test_key_reused_for_another_take_is_409(client, keys, account, conn):
    take(client, keys, idempotency_key="k")
    r = client.post(
        f"/v1/accounts/{account}/takes",
        json={"metric": "urls", "units": 2, "idempotency_key": "k"},
        headers=keys["product"],
    )
    assert_error(r, 409, "idempotency_key_reused")
    assert counter(conn, account, "urls")["used"] == 1


def test_exhausted_is_409_with_used_limit_remaining(client, keys, account, conn):
    set_override(conn, account, "urls", 10)
    for _ in range(3):
        take(client, keys, units=3)
    r = client.post(
        f"/v1/accounts/{account}/takes", json={"metric": "urls", "units": 3}, headers=keys["product"]
    )
    err = assert_error(r, 409, "quota_exhausted")
    assert (err["used"], err["limit"], err["remaining"]) == (9, 10, 1)
    assert len(ledger_rows(conn, account)) == 3
    assert take(client, keys)["remaining"] == 0


def test_unknown_account_404_deleted_410_unknown_metric_422(client, keys, account, conn):
    assert_error(
        client.post("/v1/accounts/nobody/takes", json={"metric": "urls"}, headers=keys["product"]),
        404,
        "unknown_account",
    )
    err = assert_error(
        client.post(f"/v1/accounts/{account}/takes", json={"metric": "bananas"}, headers=keys["product"]), 422
    )
    assert "bananas" in err["message"]
    soft_delete(conn, account)
    assert_error(
        client.post(f"/v1/accounts/{account}/takes", json={"metric": "urls"}, headers=keys["product"]),
        410,
        "account_deleted",
    )
    assert ledger_rows(conn, account) == []


INVALID_TAKES = [
    ({}, "metric"),
    ({"metric": None}, "metric"),
    ({"metric": 5}, "metric"),
    ({"metric": ""}, "metric"),
    ({"metric": "urls", "units": "1"}, "units"),
    ({"metric": "urls", "units": 1.0}, "units"),
    ({"metric": "urls", "units": 1.5}, "units"),
    ({"metric": "urls", "units": True}, "units"),
    ({"metric": "urls", "units": None}, "units"),
    ({"metric": "urls", "units": 0}, "units"),
    ({"metric": "urls", "units": -1}, "units"),
    ({"metric": "urls", "units": MAX_UNITS + 1}, "units"),
    ({"metric": "urls", "units": 2**64}, "units"),
    ({"metric": "urls", "units": [1]}, "units"),
    ({"metric": "urls", "idempotency_key": ""}, "idempotency_key"),
    ({"metric": "urls", "idempotency_key": "k" * 256}, "idempotency_key"),
    ({"metric": "urls", "idempotency_key": 7}, "idempotency_key"),
    ({"metric": "urls", "account_id": "other"}, "account_id"),
    ({"metric": "urls", "Units": 2}, "Units"),
]


def test_invalid_take_is_422_per_field_and_moves_nothing(client, keys, account, conn, subtests):
    for body, field in INVALID_TAKES:
        with subtests.test(body=body):
            r = client.post(f"/v1/accounts/{account}/takes", json=body, headers=keys["product"])
            err = assert_error(r, 422, "validation_failed")
            assert set(err["fields"]) == {field}, err
            assert all(isinstance(m, str) for m in err["fields"][field])
    assert ledger_rows(conn, account) == []


def test_boundary_values_are_accepted(client, keys, account, conn):
    set_override(conn, account, "urls", None)
    assert take(client, keys, units=MAX_UNITS)["used"] == MAX_UNITS
    assert take(client, keys, idempotency_key="k" * 255)["limit"] is None
    assert take(client, keys, idempotency_key="x")["remaining"] is None


def test_take_body_not_a_json_object_is_400(client, keys, account, subtests):
    for raw in ["", "{", "[]", '["urls"]', '"urls"', "1", "null", "true", "\xff\xfe"]:
        with subtests.test(raw=raw):
            r = client.post(
                f"/v1/accounts/{account}/takes",
                data=raw,
                content_type="application/json",
                headers=keys["product"],
            )
            assert_error(r, 400)


def test_release_gives_back_once(client, keys, account, conn):
    t = take(client, keys, units=3)
    take(client, keys, units=2)

    r = client.post(f"/v1/takes/{t['take_id']}/release", headers=keys["product"])
    assert r.status_code == 200
    assert r.json == {
        "released": True,
        "take_id": t["take_id"],
        "metric": "urls",
        "units": 3,
        "used": 2,
        "limit": 50,
        "remaining": 48,
        "period": PERIOD,
        "limit_source": "plan",
    }
    again = client.post(f"/v1/takes/{t['take_id']}/release", headers=keys["product"])
    assert again.status_code == 200
    assert again.json == {"released": False, "reason": "already_released", "take_id": t["take_id"]}
    assert counter(conn, account, "urls")["used"] == 2
    assert [r["actor"] for r in ledger_rows(conn, account, kind="release")] == ["test-product"]


def test_release_of_a_take_from_a_closed_period(client, keys, account, conn, plans):
    from service.quota import takes

    set_period(conn, account, "urls", "2024-01")
    old = takes.take(conn, plans, account_id=account, metric="urls", units=4, actor="t", period="2024-01")
    take(client, keys)
    before = ledger_rows(conn, account)

    r = client.post(f"/v1/takes/{old.take_id}/release", headers=keys["product"])

    assert r.status_code == 200
    assert r.json == {"released": False, "reason": "period_closed", "take_id": old.take_id}
    assert ledger_rows(conn, account) == before
    assert counter(conn, account, "urls")["used"] == 1


def test_release_of_unknown_or_huge_take_id_is_404(client, keys, subtests):
    for take_id in ["999999", str(2**63 - 1), str(2**63), str(10**30)]:
        with subtests.test(take_id=take_id):
            assert_error(client.post(f"/v1/takes/{take_id}/release", headers=keys["product"]), 404)


def test_release_of_a_non_integer_take_id_is_404(client, keys, subtests):
    for take_id in ["abc", "-1", "1.5", "0x10"]:
        with subtests.test(take_id=take_id):
            assert_error(client.post(f"/v1/takes/{take_id}/release", headers=keys["product"]), 404)


def test_release_ignores_a_body(client, keys, account):
    t = take(client, keys)
    r = client.post(f"/v1/takes/{t['take_id']}/release", data="junk", headers=keys["product"])
    assert r.status_code == 200 and r.json["released"] is True

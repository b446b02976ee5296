"""POST /v1/accounts/{id}/takes/{take_id}/release: the release that names its account (one shard on
Citus), answering as the older /v1/takes/{take_id}/release does. Runs on plain PostgreSQL and on the
cluster."""

from __future__ import annotations

from tests.db.helpers import counter
from tests.http.conftest import assert_error, put_account, take


def test_the_account_route_releases_once_like_the_take_route(client, keys, account, conn):
    first, second = take(client, keys, units=3), take(client, keys, units=2)

    path = f"/v1/accounts/{account}/takes/{first['take_id']}/release"
    by_account = client.post(path, headers=keys["product"])
    by_take = client.post(f"/v1/takes/{second['take_id']}/release", headers=keys["product"])

    assert by_account.status_code == by_take.status_code == 200
    assert by_account.json["released"] and by_take.json["released"]
    assert by_account.json["units"] == 3 and by_take.json["used"] == 0
    assert counter(conn, account, "urls")["used"] == 0
    again = client.post(path, headers=keys["product"])
    assert again.json == {"released": False, "reason": "already_released", "take_id": first["take_id"]}


def test_a_take_of_another_account_is_unknown_on_this_ones_route(client, keys, account, conn):
    put_account(client, keys, "acc-2")
    t = take(client, keys, units=1)

    assert_error(
        client.post(f"/v1/accounts/acc-2/takes/{t['take_id']}/release", headers=keys["product"]), 404
    )
    assert_error(client.post("/v1/accounts/acc-2/takes/999999/release", headers=keys["product"]), 404)
    assert counter(conn, account, "urls")["used"] == 1

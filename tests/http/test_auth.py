"""Every /v1 route asks for a key: missing, malformed, unknown or revoked keys get 401, a key of the
wrong role 403. The routes and their roles are read from the app, so a new route is covered too."""

from __future__ import annotations

import re

from service.keys import create_key, revoke_key
from tests.http.conftest import assert_error

SAMPLE = {"id": "acc-1", "metric": "urls", "feature": "sso", "take_id": "1", "inbox_id": "1", "grant_id": "1"}
SAMPLE |= {"endpoint_id": "we_1", "delivery_id": "1"}


def _v1_routes(app):
    out = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/v1/"):
            continue
        roles = app.view_functions[rule.endpoint].roles
        path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: SAMPLE[m.group(1)], rule.rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            out.append((method, path, roles))
    return out


def test_routes_are_found(app):
    routes = {(m, p) for m, p, _ in _v1_routes(app)}
    assert ("POST", "/v1/accounts/acc-1/takes") in routes
    assert ("PUT", "/v1/admin/accounts/acc-1/overrides/urls") in routes


def test_missing_or_unknown_key_is_401_everywhere(app, client, keys, subtests):
    for header in [None, "", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer qlk_not_a_real_key", "qlk_x"]:
        headers = {} if header is None else {"Authorization": header}
        for method, path, _ in _v1_routes(app):
            with subtests.test(header=header, method=method, path=path):
                r = client.open(path, method=method, json={"metric": "urls"}, headers=headers)
                assert_error(r, 401, "unauthorized")


def test_revoked_key_is_401(client, conn, keys):
    key = create_key(conn, name="short-lived", role="product")
    headers = {"Authorization": f"Bearer {key}"}
    assert client.get("/v1/accounts/nobody", headers=headers).status_code == 404
    assert revoke_key(conn, name="short-lived")
    assert_error(client.get("/v1/accounts/nobody", headers=headers), 401, "unauthorized")


def test_wrong_role_is_403_everywhere(app, client, keys):
    checked = 0
    for method, path, roles in _v1_routes(app):
        for role in ("product", "admin", "finance"):
            if role in roles:
                continue
            r = client.open(path, method=method, json={"metric": "urls"}, headers=keys[role])
            assert_error(r, 403, "forbidden")
            checked += 1
    assert checked >= 8


def test_finance_key_on_product_endpoints_and_product_key_on_admin(client, keys, account):
    assert_error(client.get(f"/v1/accounts/{account}", headers=keys["finance"]), 403)
    assert_error(
        client.post(f"/v1/accounts/{account}/takes", json={"metric": "urls"}, headers=keys["finance"]), 403
    )
    assert_error(client.get(f"/v1/admin/accounts/{account}", headers=keys["product"]), 403)
    assert_error(
        client.put(
            f"/v1/admin/accounts/{account}/overrides/urls", json={"limit": 1}, headers=keys["product"]
        ),
        403,
    )


def test_admin_key_may_do_what_product_does(client, keys, account):
    assert client.get(f"/v1/accounts/{account}", headers=keys["admin"]).status_code == 200
    r = client.post(f"/v1/accounts/{account}/takes", json={"metric": "urls"}, headers=keys["admin"])
    assert r.status_code == 201
    assert client.post(f"/v1/takes/{r.json['take_id']}/release", headers=keys["admin"]).json["released"]


def test_auth_comes_before_validation_and_changes_nothing(client, keys, account, conn):
    r = client.post(f"/v1/accounts/{account}/takes", data="not json", headers={"Authorization": "Bearer x"})
    assert_error(r, 401)
    r = client.post(f"/v1/accounts/{account}/takes", json={"metric": "urls"}, headers=keys["finance"])
    assert_error(r, 403)
    assert conn.execute("SELECT count(*) FROM ledger").fetchone()[0] == 0

"""Boolean features: the limits' precedence (override > a lapsed paid plan gets the free plan's >
the plan's), sticky overrides through the admin routes, audited unless they change nothing, and
`check?feature=`. tests/plans.toml: free has export_csv; basic api_access; pro api_access and
custom_domains; business those and sso."""

from __future__ import annotations

from service.quota import periods, reset
from service.quota.plan_sync import sync_plans
from tests.db.helpers import set_plan, soft_delete
from tests.http.conftest import assert_error, take

FEATURES = ["api_access", "custom_domains", "export_csv", "sso"]


def _features(client, keys, account, role="product"):
    path = f"/v1/admin/accounts/{account}" if role == "admin" else f"/v1/accounts/{account}"
    r = client.get(path, headers=keys[role])
    assert r.status_code == 200, r.json
    return r.json["features"]


def _on(client, keys, account):
    """The features that are on, each with its source."""
    return {f: s["source"] for f, s in _features(client, keys, account).items() if s["enabled"]}


def _put(client, keys, account, feature, enabled):
    return client.put(
        f"/v1/admin/accounts/{account}/features/{feature}", json={"enabled": enabled}, headers=keys["admin"]
    )


def _delete(client, keys, account, feature):
    return client.delete(f"/v1/admin/accounts/{account}/features/{feature}", headers=keys["admin"])


def _check(client, keys, account, feature):
    r = client.get(
        f"/v1/accounts/{account}/check", query_string={"feature": feature}, headers=keys["product"]
    )
    assert r.status_code == 200, r.json
    return r.json


def _audit(conn, account):
    return conn.execute(
        "SELECT actor, action, metric, old, new FROM audit_log"
        " WHERE account_id = %s AND action LIKE 'feature%%' ORDER BY id",
        (account,),
    ).fetchall()


def test_the_account_view_lists_every_feature_with_its_source(client, keys, account):
    product = _features(client, keys, account)
    assert sorted(product) == FEATURES
    assert product["export_csv"] == {"enabled": True, "source": "plan"}
    assert product["sso"] == {"enabled": False, "source": "plan"}
    admin = _features(client, keys, account, role="admin")
    assert admin["sso"] == {"enabled": False, "source": "plan", "override": None}


def test_features_follow_the_plan_and_a_lapse_falls_back_to_the_free_plans(
    client, keys, account, conn, plans
):
    set_plan(conn, plans, account_id=account, plan="pro", status="active", actor="t")
    assert _on(client, keys, account) == {"api_access": "plan", "custom_domains": "plan"}
    assert _check(client, keys, account, "custom_domains") == {
        "allowed": True,
        "feature": "custom_domains",
        "source": "plan",
    }
    set_plan(conn, plans, account_id=account, plan="pro", status="canceled", actor="t")
    assert _on(client, keys, account) == {"export_csv": "free_fallback"}
    assert _features(client, keys, account)["custom_domains"] == {"enabled": False, "source": "free_fallback"}
    assert _check(client, keys, account, "custom_domains")["source"] == "free_fallback"
    set_plan(conn, plans, account_id=account, plan="pro", status="past_due", actor="t")  # grace keeps them
    assert _on(client, keys, account) == {"api_access": "plan", "custom_domains": "plan"}
    set_plan(conn, plans, account_id=account, plan="free", status="canceled", actor="t")  # never lapsed
    assert _on(client, keys, account) == {"export_csv": "plan"}


def test_a_plan_the_config_does_not_know_has_the_free_plans_features(client, keys, account, conn):
    conn.execute(
        "UPDATE accounts SET plan = 'retired', subscription_status = 'active' WHERE id = %s", (account,)
    )
    assert _on(client, keys, account) == {"export_csv": "plan"}


def test_an_override_wins_both_ways_and_clearing_restores_the_plan(client, keys, account, conn, plans):
    set_plan(conn, plans, account_id=account, plan="pro", status="canceled", actor="t")
    r = _put(client, keys, account, "sso", True)
    assert r.status_code == 200, r.json
    assert r.json == {
        "account_id": account,
        "feature": "sso",
        "enabled": True,
        "source": "override",
        "override": True,
        "previous": None,
    }
    r = _put(client, keys, account, "export_csv", False)
    assert (r.json["enabled"], r.json["override"], r.json["previous"]) == (False, False, None)
    assert _on(client, keys, account) == {"sso": "override"}
    assert _check(client, keys, account, "export_csv") == {
        "allowed": False,
        "feature": "export_csv",
        "source": "override",
    }
    admin = _features(client, keys, account, role="admin")
    assert admin["export_csv"] == {"enabled": False, "source": "override", "override": False}

    r = _delete(client, keys, account, "sso")
    assert r.status_code == 200
    assert (r.json["enabled"], r.json["source"], r.json["override"], r.json["previous"]) == (
        False,
        "free_fallback",
        None,
        True,
    )
    assert _on(client, keys, account) == {}  # export_csv is still overridden off


def test_override_changes_are_audited_and_a_no_op_writes_nothing(client, keys, account, conn):
    r = _delete(client, keys, account, "sso")  # none set: answered, not audited
    assert r.status_code == 200 and r.json["previous"] is None and r.json["override"] is None
    assert _audit(conn, account) == []
    _put(client, keys, account, "sso", True)
    r = _put(client, keys, account, "sso", True)
    assert r.status_code == 200 and r.json["previous"] is True and r.json["override"] is True
    _put(client, keys, account, "sso", False)
    _delete(client, keys, account, "sso")
    _delete(client, keys, account, "sso")
    assert _audit(conn, account) == [
        ("test-admin", "feature_override_set", "sso", None, {"enabled": True}),
        ("test-admin", "feature_override_set", "sso", {"enabled": True}, {"enabled": False}),
        ("test-admin", "feature_override_cleared", "sso", {"enabled": False}, None),
    ]


def test_an_override_survives_a_reset_and_a_plan_sync(client, keys, account, conn, plans):
    """Neither job writes features: a plan's are read from the config, an override is the only row."""
    set_plan(conn, plans, account_id=account, plan="basic", status="active", actor="t")
    _put(client, keys, account, "sso", True)
    _put(client, keys, account, "api_access", False)
    take(client, keys, account, units=3)
    before = _features(client, keys, account, role="admin")

    next_month = periods.period_start(periods.next_period(periods.current_period()))
    assert reset.reset_month(conn, at=next_month).counters_reset >= 1
    sync_plans(conn, plans)
    assert _features(client, keys, account, role="admin") == before
    assert _on(client, keys, account) == {"sso": "override"}


def test_feature_override_refusals(client, keys, account, conn, subtests):
    for body in [{}, {"enabled": 1}, {"enabled": "true"}, {"enabled": None}, {"enabled": True, "x": 1}]:
        with subtests.test(body=body):
            err = assert_error(
                client.put(f"/v1/admin/accounts/{account}/features/sso", json=body, headers=keys["admin"]),
                422,
                "validation_failed",
            )
            assert err["fields"]
    with subtests.test("not an object"):
        r = client.put(f"/v1/admin/accounts/{account}/features/sso", data="[true]", headers=keys["admin"])
        assert_error(r, 400, "invalid_json")
    with subtests.test("unknown feature"):
        assert_error(_put(client, keys, account, "teleport", True), 422, "unknown_feature")
        assert_error(_delete(client, keys, account, "teleport"), 422, "unknown_feature")
        assert_error(_put(client, keys, account, "urls", True), 422, "unknown_feature")  # a metric
    with subtests.test("unknown account"):
        assert_error(_put(client, keys, "nobody", "sso", True), 404, "unknown_account")
        assert_error(_delete(client, keys, "nobody", "sso"), 404, "unknown_account")
    with subtests.test("invalid account id"):
        assert_error(_put(client, keys, "bad id!", "sso", True), 422, "validation_failed")
    with subtests.test("roles"):
        for role in ("product", "finance"):
            r = client.put(
                f"/v1/admin/accounts/{account}/features/sso", json={"enabled": True}, headers=keys[role]
            )
            assert_error(r, 403, "forbidden")
        assert_error(client.delete(f"/v1/admin/accounts/{account}/features/sso"), 401, "unauthorized")
    assert _audit(conn, account) == []
    assert _features(client, keys, account)["sso"] == {"enabled": False, "source": "plan"}


def test_check_feature_refusals(client, keys, account, conn):
    def check(account_id, **query):
        return client.get(f"/v1/accounts/{account_id}/check", query_string=query, headers=keys["product"])

    assert_error(check(account, feature="teleport"), 422, "unknown_feature")
    assert_error(check(account, feature="urls"), 422, "unknown_feature")
    assert_error(check(account, feature="sso", units="2"), 422, "validation_failed")
    assert_error(check(account, feature="sso", metric="urls"), 422, "validation_failed")
    assert_error(check(account), 422, "validation_failed")
    assert_error(check("nobody", feature="sso"), 404, "unknown_account")
    assert_error(check("bad id!", feature="sso"), 422, "validation_failed")
    assert_error(
        client.get(f"/v1/accounts/{account}/check", query_string={"feature": "sso"}, headers=keys["finance"]),
        403,
        "forbidden",
    )
    soft_delete(conn, account)
    assert_error(check(account, feature="sso"), 410, "account_deleted")

"""Admin overrides and the effective-limit precedence: override > lapsed paid falls back to free >
stored plan limit, each answer naming the rule that won; every override change is audited."""

from __future__ import annotations

from tests.db.helpers import counter, set_plan, soft_delete
from tests.http.conftest import assert_error, take


def _limit(client, keys, account, metric="urls", role="product"):
    path = f"/v1/admin/accounts/{account}" if role == "admin" else f"/v1/accounts/{account}"
    r = client.get(path, headers=keys[role])
    assert r.status_code == 200, r.json
    return r.json["limits"][metric]


def _override(client, keys, account, limit, metric="urls"):
    return client.put(
        f"/v1/admin/accounts/{account}/overrides/{metric}", json={"limit": limit}, headers=keys["admin"]
    )


def _audit(conn, account):
    return conn.execute(
        "SELECT actor, action, metric, old, new FROM audit_log"
        " WHERE account_id = %s AND action LIKE 'override%%' ORDER BY id",
        (account,),
    ).fetchall()


def test_override_beats_plan_and_clearing_restores_it(client, keys, account):
    r = _override(client, keys, account, 7)
    assert r.status_code == 200
    assert r.json["limit"] == 7 and r.json["limit_source"] == "override"
    assert r.json["override"] == {"limit": 7} and r.json["plan_limit"] == 50 and r.json["previous"] is None
    assert (_limit(client, keys, account)["limit"], _limit(client, keys, account)["limit_source"]) == (
        7,
        "override",
    )
    for _ in range(7):
        take(client, keys)
    assert_error(
        client.post(f"/v1/accounts/{account}/takes", json={"metric": "urls"}, headers=keys["product"]), 409
    )

    r = client.delete(f"/v1/admin/accounts/{account}/overrides/urls", headers=keys["admin"])
    assert r.status_code == 200
    assert (r.json["limit"], r.json["limit_source"], r.json["override"]) == (50, "plan", None)
    assert r.json["previous"] == {"limit": 7}
    assert take(client, keys)["used"] == 8


def test_override_null_is_unlimited(client, keys, account):
    r = _override(client, keys, account, None)
    assert r.status_code == 200 and r.json["override"] == {"limit": None}
    m = _limit(client, keys, account)
    assert (m["limit"], m["remaining"], m["limit_source"]) == (None, None, "override")
    t = take(client, keys, units=10_000)
    assert (t["limit"], t["remaining"], t["limit_source"]) == (None, None, "override")


def test_override_zero_refuses_and_lowering_below_used_refuses_without_touching_usage(
    client, keys, account, conn
):
    take(client, keys, units=5)
    assert _override(client, keys, account, 2).status_code == 200
    m = _limit(client, keys, account)
    assert (m["used"], m["limit"], m["remaining"]) == (5, 2, 0)
    err = assert_error(
        client.post(f"/v1/accounts/{account}/takes", json={"metric": "urls"}, headers=keys["product"]), 409
    )
    assert (err["used"], err["limit"], err["remaining"]) == (5, 2, 0)
    assert _override(client, keys, account, 0).status_code == 200
    assert counter(conn, account, "urls")["used"] == 5


def test_lapsed_paid_plan_falls_back_to_free(client, keys, account, conn, plans):
    set_plan(conn, plans, account_id=account, plan="pro", status="active", actor="t")
    m = _limit(client, keys, account)
    assert (m["limit"], m["limit_source"]) == (500, "plan")
    assert _limit(client, keys, account, "api_calls")["limit"] is None

    set_plan(conn, plans, account_id=account, plan="pro", status="canceled", actor="t")
    r = client.get(f"/v1/accounts/{account}", headers=keys["product"])
    assert r.json["plan"] == "pro" and r.json["subscription_status"] == "canceled"
    assert (r.json["limits"]["urls"]["limit"], r.json["limits"]["urls"]["limit_source"]) == (
        50,
        "free_fallback",
    )
    assert r.json["limits"]["api_calls"]["limit"] == 1000
    assert take(client, keys)["limit_source"] == "free_fallback"

    set_plan(conn, plans, account_id=account, plan="pro", status="past_due", actor="t")
    assert _limit(client, keys, account)["limit_source"] == "plan"  # grace period keeps the paid limits


def test_override_beats_a_lapsed_plan_and_survives_plan_changes(client, keys, account, conn, plans):
    set_plan(conn, plans, account_id=account, plan="pro", status="canceled", actor="t")
    _override(client, keys, account, 3)
    assert (_limit(client, keys, account)["limit"], _limit(client, keys, account)["limit_source"]) == (
        3,
        "override",
    )
    set_plan(conn, plans, account_id=account, plan="business", status="active", actor="t")
    admin = _limit(client, keys, account, role="admin")
    assert (admin["limit"], admin["plan_limit"], admin["override"]) == (3, 5000, {"limit": 3})


def test_free_plan_is_never_lapsed(client, keys, account, conn, plans):
    set_plan(conn, plans, account_id=account, plan="free", status="canceled", actor="t")
    assert _limit(client, keys, account)["limit_source"] == "plan"


def test_override_changes_are_audited_with_previous_value(client, keys, account, conn):
    _override(client, keys, account, 5)
    _override(client, keys, account, None)
    client.delete(f"/v1/admin/accounts/{account}/overrides/urls", headers=keys["admin"])

    assert _audit(conn, account) == [
        ("test-admin", "override_set", "urls", None, {"limit": 5}),
        ("test-admin", "override_set", "urls", {"limit": 5}, {"limit": None}),
        ("test-admin", "override_cleared", "urls", {"limit": None}, None),
    ]


def test_an_override_change_that_changes_nothing_writes_no_audit_row(client, keys, account, conn):
    """Clearing an override that is not set, or setting the value it already has, is answered as
    usual (200, `previous` says what was there) but the audit log records only what changed."""
    r = client.delete(f"/v1/admin/accounts/{account}/overrides/urls", headers=keys["admin"])
    assert r.status_code == 200 and r.json["previous"] is None and r.json["override"] is None
    assert _audit(conn, account) == []
    _override(client, keys, account, 5)
    r = _override(client, keys, account, 5)
    assert r.status_code == 200 and r.json["previous"] == {"limit": 5} and r.json["override"] == {"limit": 5}
    _override(client, keys, account, None)
    _override(client, keys, account, None)
    client.delete(f"/v1/admin/accounts/{account}/overrides/urls", headers=keys["admin"])
    r = client.delete(f"/v1/admin/accounts/{account}/overrides/urls", headers=keys["admin"])
    assert r.status_code == 200 and r.json["previous"] is None
    assert _audit(conn, account) == [
        ("test-admin", "override_set", "urls", None, {"limit": 5}),
        ("test-admin", "override_set", "urls", {"limit": 5}, {"limit": None}),
        ("test-admin", "override_cleared", "urls", {"limit": None}, None),
    ]


def test_admin_view_shows_plan_limit_override_and_deleted(client, keys, account, conn):
    _override(client, keys, account, 12, metric="seats")
    r = client.get(f"/v1/admin/accounts/{account}", headers=keys["admin"])
    assert r.status_code == 200
    assert r.json["deleted"] is False
    seats, urls = r.json["limits"]["seats"], r.json["limits"]["urls"]
    assert (seats["limit"], seats["plan_limit"], seats["override"]) == (12, 1, {"limit": 12})
    assert (urls["limit"], urls["plan_limit"], urls["override"]) == (50, 50, None)
    product = client.get(f"/v1/accounts/{account}", headers=keys["product"]).json
    assert "override" not in product["limits"]["seats"] and product["deleted"] is False
    soft_delete(conn, account)
    assert client.get(f"/v1/admin/accounts/{account}", headers=keys["admin"]).json["deleted"] is True


def test_override_refusals(client, keys, account, conn, subtests):
    cases = [
        ({}, 422),
        ({"limit": -1}, 422),
        ({"limit": "5"}, 422),
        ({"limit": 5.0}, 422),
        ({"limit": True}, 422),
        ({"limit": 2**63}, 422),
        ({"limit": 5, "metric": "urls"}, 422),
    ]
    for body, status in cases:
        with subtests.test(body=body):
            err = assert_error(
                client.put(f"/v1/admin/accounts/{account}/overrides/urls", json=body, headers=keys["admin"]),
                status,
                "validation_failed",
            )
            assert err["fields"]
    with subtests.test("not an object"):
        r = client.put(f"/v1/admin/accounts/{account}/overrides/urls", data="[5]", headers=keys["admin"])
        assert_error(r, 400)
    with subtests.test("unknown metric"):
        assert_error(_override(client, keys, account, 5, metric="bananas"), 422)
        assert_error(
            client.delete(f"/v1/admin/accounts/{account}/overrides/bananas", headers=keys["admin"]), 422
        )
    with subtests.test("unknown account"):
        assert_error(_override(client, keys, "nobody", 5), 404, "unknown_account")
        assert_error(client.delete("/v1/admin/accounts/nobody/overrides/urls", headers=keys["admin"]), 404)
        assert_error(client.get("/v1/admin/accounts/nobody", headers=keys["admin"]), 404)
    assert _audit(conn, account) == []
    assert _limit(client, keys, account)["limit_source"] == "plan"


def test_largest_override_is_accepted(client, keys, account):
    r = _override(client, keys, account, 2**63 - 1)
    assert r.status_code == 200 and r.json["remaining"] == 2**63 - 1


def test_a_plan_change_counts_and_audits_each_limit_it_changes(client, keys, account, conn, plans):
    def audit_rows():
        return conn.execute(
            "SELECT metric, old, new FROM audit_log WHERE account_id = %s AND action = 'plan_limit_changed'"
            " ORDER BY id",
            (account,),
        ).fetchall()

    assert set_plan(conn, plans, account_id=account, plan="pro", status="active", actor="t") == 4
    assert [(m, o["plan_limit"], n["plan_limit"]) for m, o, n in audit_rows()] == [
        ("api_calls", 1000, None),
        ("exports", 3, 50),
        ("seats", 1, 5),
        ("urls", 50, 500),
    ]
    # the same plan again: no audit row
    assert set_plan(conn, plans, account_id=account, plan="pro", status="active", actor="t") == 0
    assert len(audit_rows()) == 4
    # only a lapse (the values stay, the free fallback switches): audited too, as plan sync audits it
    # (one definition, quota_set_plan_limits), with the lapsed flag in old and new
    assert set_plan(conn, plans, account_id=account, plan="pro", status="canceled", actor="t") == 4
    lapse = audit_rows()[4:]
    assert [(m, o["lapsed"], n["lapsed"], o["plan_limit"] == n["plan_limit"]) for m, o, n in lapse] == [
        ("api_calls", False, True, True),
        ("exports", False, True, True),
        ("seats", False, True, True),
        ("urls", False, True, True),
    ]
    assert _limit(client, keys, account)["limit_source"] == "free_fallback"
    # a plan the config does not know gets the free plan's limits
    assert set_plan(conn, plans, account_id=account, plan="gone", status="active", actor="t") == 4
    assert _limit(client, keys, account)["limit"] == 50

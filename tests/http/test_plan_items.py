"""The HTTP face of the three kinds of metric (tests/plans.toml): seats an allocation, exports reset
daily, urls monthly. The rules themselves are tested in tests/db/test_plan_items.py."""

from __future__ import annotations

from service.quota import periods
from tests.http.conftest import assert_error, take

TODAY = periods.day_of(periods.now())
MONTH = periods.current_period()


def test_the_account_view_says_each_metrics_kind_and_period(client, keys, account):
    take(client, keys, metric="seats")
    limits = client.get(f"/v1/accounts/{account}", headers=keys["product"]).json["limits"]

    assert limits["seats"] == {
        "kind": "allocation",
        "reset": None,
        "limit": 1,
        "limit_source": "plan",
        "used": 1,
        "credits": 0,  # an allocation takes no grants
        "remaining": 0,
        "over_limit": False,
        "period": None,
        "resets_at": None,
    }
    assert (limits["exports"]["kind"], limits["exports"]["reset"]) == ("consumable", "day")
    assert (limits["exports"]["period"], limits["exports"]["resets_at"]) == (TODAY, periods.resets_at(TODAY))
    assert (limits["urls"]["reset"], limits["urls"]["period"]) == ("month", MONTH)


def test_a_seat_is_taken_without_a_period_and_given_back(client, keys, account):
    seat = take(client, keys, metric="seats")
    assert (seat["period"], seat["used"], seat["remaining"]) == (None, 1, 0)
    assert_error(
        client.post(f"/v1/accounts/{account}/takes", json={"metric": "seats"}, headers=keys["product"]),
        409,
        "quota_exhausted",
    )
    r = client.post(f"/v1/accounts/{account}/takes/{seat['take_id']}/release", headers=keys["product"])
    assert r.status_code == 200 and r.json["released"] is True and r.json["period"] is None


def test_an_over_limit_allocation_shows_it(client, keys, account):
    client.put(f"/v1/admin/accounts/{account}/overrides/seats", json={"limit": 2}, headers=keys["admin"])
    take(client, keys, metric="seats", units=2)
    client.put(f"/v1/admin/accounts/{account}/overrides/seats", json={"limit": 1}, headers=keys["admin"])
    seats = client.get(f"/v1/accounts/{account}", headers=keys["product"]).json["limits"]["seats"]
    assert (seats["used"], seats["limit"], seats["remaining"], seats["over_limit"]) == (2, 1, 0, True)


def test_an_admin_reset_of_an_allocation_is_409_not_resettable(client, keys, account):
    take(client, keys, metric="seats")
    r = client.post(f"/v1/admin/accounts/{account}/reset", json={"metric": "seats"}, headers=keys["admin"])
    assert_error(r, 409, "not_resettable")
    r = client.post(f"/v1/admin/accounts/{account}/reset", json={"metric": "exports"}, headers=keys["admin"])
    assert r.status_code == 200 and r.json["period"] == TODAY


def test_usage_names_a_period_of_the_metrics_kind(client, keys, account, subtests):
    take(client, keys, metric="exports", units=2)
    take(client, keys, metric="seats")

    def usage(**q: str) -> object:
        return client.get(f"/v1/accounts/{account}/usage", query_string=q, headers=keys["product"])

    assert usage(metric="exports").json == {"metric": "exports", "period": TODAY, "used": 2}
    assert usage(metric="exports", period=TODAY).json["used"] == 2
    assert usage(metric="exports", period="2020-01-01").json["used"] == 0
    assert usage(metric="seats").json == {"metric": "seats", "period": None, "used": 1}
    for query in (
        {"metric": "seats", "period": MONTH},
        {"metric": "exports", "period": MONTH},
        {"metric": "urls", "period": TODAY},
        {"metric": "exports", "period": "2026-13-01"},
        {"metric": "exports", "period": "held"},
    ):
        with subtests.test(**query):
            assert_error(usage(**query), 422, "validation_failed")


def test_finance_reads_name_days_and_held(client, keys, account):
    take(client, keys, metric="seats")
    take(client, keys, metric="exports")
    for period in (periods.HELD, TODAY, MONTH):
        r = client.get("/v1/reconciliation", query_string={"period": period}, headers=keys["finance"])
        assert r.status_code == 200 and r.json["mismatches"] == [] and r.json["checked"] >= 1, (
            period,
            r.json,
        )
    page = client.get("/v1/ledger", query_string={"period": periods.HELD}, headers=keys["finance"]).json
    assert [(e["metric"], e["kind"]) for e in page["items"]] == [("seats", "take")]
    assert_error(
        client.get("/v1/reconciliation", query_string={"period": "someday"}, headers=keys["finance"]), 422
    )

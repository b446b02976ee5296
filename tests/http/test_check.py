"""`GET /v1/accounts/{id}/check?metric=M&units=N`: whether a take of N would be granted now, written
nowhere, and agreeing with what the take then does."""

from __future__ import annotations

from service.quota import periods
from tests.db.helpers import counter, set_override, set_period, soft_delete
from tests.http.conftest import assert_error, take


def _check(client, keys, account="acc-1", status=200, **query):
    r = client.get(f"/v1/accounts/{account}/check", query_string=query, headers=keys["product"])
    assert r.status_code == status, r.json
    return r.json


def _writes(conn):
    return conn.execute(
        "SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM audit_log),"
        " (SELECT array_agg((account_id, metric, period, used) ORDER BY account_id, metric) FROM quotas)"
    ).fetchone()


def test_the_answer_describes_the_counter(client, keys, account):
    take(client, keys, units=10)
    period = periods.current_period()
    assert _check(client, keys, metric="urls") == {
        "allowed": True,
        "metric": "urls",
        "units": 1,
        "limit": 50,
        "used": 10,
        "remaining": 40,
        "limit_source": "plan",
        "period": period,
        "resets_at": periods.resets_at(period),
    }
    big = _check(client, keys, metric="urls", units="41")
    assert (big["allowed"], big["units"], big["used"], big["remaining"]) == (False, 41, 10, 40)


def test_a_check_agrees_with_the_take_that_follows(client, keys, account, conn):
    set_override(conn, account, "urls", 5)
    for units in (2, 3, 1, 1):
        answer = _check(client, keys, metric="urls", units=str(units))
        if answer["allowed"]:
            assert take(client, keys, units=units)["used"] == answer["used"] + units
        else:
            err = assert_error(
                client.post(
                    f"/v1/accounts/{account}/takes",
                    json={"metric": "urls", "units": units},
                    headers=keys["product"],
                ),
                409,
                "quota_exhausted",
            )
            assert (err["used"], err["limit"]) == (answer["used"], answer["limit"])
    assert counter(conn, account, "urls")["used"] == 5
    assert _check(client, keys, metric="urls")["allowed"] is False
    assert _check(client, keys, metric="urls")["limit_source"] == "override"


def test_unlimited_is_always_allowed(client, keys, account, conn):
    set_override(conn, account, "urls", None)
    answer = _check(client, keys, metric="urls", units=str(2**31 - 1))
    assert (answer["allowed"], answer["limit"], answer["remaining"]) == (True, None, None)


def test_a_counter_of_an_earlier_period_reads_as_the_new_period_and_is_left_alone(
    client, keys, account, conn
):
    take(client, keys, units=50)
    set_period(conn, account, "urls", "2020-01")
    before = _writes(conn)
    answer = _check(client, keys, metric="urls", units="50")
    assert (answer["allowed"], answer["used"], answer["period"]) == (True, 0, periods.current_period())
    assert _writes(conn) == before  # no rollover: only a take opens the period
    assert take(client, keys, units=50)["used"] == 50


def test_a_check_writes_nothing(client, keys, account, conn):
    take(client, keys, units=3)
    before = _writes(conn)
    for units in ("1", "47", "48"):
        _check(client, keys, metric="urls", units=units)
    assert _writes(conn) == before


def test_a_missing_counter_is_created_as_a_take_would(client, keys, account, conn):
    conn.execute("DELETE FROM quotas WHERE account_id = %s AND metric = 'seats'", (account,))
    answer = _check(client, keys, metric="seats")
    assert (answer["allowed"], answer["used"], answer["limit"]) == (True, 0, 1)
    assert counter(conn, account, "seats")["used"] == 0


def test_check_metric_refusals(client, keys, account, conn, subtests):
    for query in [
        {},
        {"units": "1"},
        {"metric": "urls", "feature": "sso"},
        {"metric": "urls", "units": "0"},
        {"metric": "urls", "units": "-1"},
        {"metric": "urls", "units": "1.5"},
        {"metric": "urls", "units": "abc"},
        {"metric": "urls", "units": str(2**31)},
        {"metric": "urls", "extra": "1"},
    ]:
        with subtests.test(query=query):
            err = assert_error(
                client.get(f"/v1/accounts/{account}/check", query_string=query, headers=keys["product"]),
                422,
                "validation_failed",
            )
            assert err["fields"]
    with subtests.test("unknown metric"):
        assert_error(
            client.get(f"/v1/accounts/{account}/check?metric=bananas", headers=keys["product"]),
            422,
            "unknown_metric",
        )
        assert_error(
            client.get(f"/v1/accounts/{account}/check?metric=sso", headers=keys["product"]),
            422,
            "unknown_metric",
        )
    with subtests.test("unknown account"):
        assert_error(client.get("/v1/accounts/nobody/check?metric=urls", headers=keys["product"]), 404)
    with subtests.test("roles"):
        assert_error(client.get(f"/v1/accounts/{account}/check?metric=urls", headers=keys["finance"]), 403)
        assert_error(client.get(f"/v1/accounts/{account}/check?metric=urls"), 401)
        assert (
            client.get(f"/v1/accounts/{account}/check?metric=urls", headers=keys["admin"]).status_code == 200
        )
    with subtests.test("deleted account"):
        soft_delete(conn, account)
        assert_error(
            client.get(f"/v1/accounts/{account}/check?metric=urls", headers=keys["product"]),
            410,
            "account_deleted",
        )


def test_each_metric_answers_in_the_period_a_take_counts_in(client, keys, account, plans):
    """A monthly consumable's month, a daily one's day, an allocation's none (`period` and
    `resets_at` null): whichever kinds tests/plans.toml gives its metrics."""
    for metric in plans.metrics:
        period = plans.period(metric)
        answer = _check(client, keys, metric=metric)
        if period == periods.HELD:
            assert (answer["period"], answer["resets_at"]) == (None, None), metric
        else:
            assert (answer["period"], answer["resets_at"]) == (period, periods.resets_at(period)), metric
        if answer["allowed"]:
            granted = take(client, keys, metric=metric)
            assert granted["used"] == answer["used"] + 1
            assert _check(client, keys, metric=metric)["used"] == granted["used"]

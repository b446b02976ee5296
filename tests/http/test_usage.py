"""GET /v1/accounts/{id}/usage: the open period from the counter, closed periods from the ledger."""

from __future__ import annotations

from service.quota import periods, takes
from tests.db.helpers import set_period
from tests.http.conftest import assert_error, take

PERIOD = periods.current_period()


def _usage(client, keys, account, **q):
    r = client.get(f"/v1/accounts/{account}/usage", query_string=q, headers=keys["product"])
    assert r.status_code == 200, r.json
    return r.json


def test_current_period(client, keys, account):
    take(client, keys, units=4)
    assert _usage(client, keys, account, metric="urls") == {"metric": "urls", "period": PERIOD, "used": 4}
    assert _usage(client, keys, account, metric="urls", period=PERIOD)["used"] == 4
    assert _usage(client, keys, account, metric="seats")["used"] == 0


def test_a_period_with_no_usage_is_zero(client, keys, account):
    take(client, keys)
    for period in ("2019-07", periods.next_period(PERIOD), "2999-12"):
        assert _usage(client, keys, account, metric="urls", period=period) == {
            "metric": "urls",
            "period": period,
            "used": 0,
        }


def test_a_closed_period_returns_its_final_used_from_the_ledger(client, keys, account, conn, plans):
    set_period(conn, account, "urls", "2024-02")
    old = [
        takes.take(conn, plans, account_id=account, metric="urls", units=u, actor="t", period="2024-02")
        for u in (3, 4, 5)
    ]
    takes.release(conn, take_id=old[1].take_id, actor="t", period="2024-02")
    take(client, keys, units=2)  # rolls over: the counter now holds this month

    assert _usage(client, keys, account, metric="urls", period="2024-02")["used"] == 8
    assert _usage(client, keys, account, metric="urls")["used"] == 2


def test_a_closed_period_never_rolled_over_reads_the_same(client, keys, account, conn, plans):
    set_period(conn, account, "urls", "2024-02")
    takes.take(conn, plans, account_id=account, metric="urls", units=6, actor="t", period="2024-02")
    assert _usage(client, keys, account, metric="urls", period="2024-02")["used"] == 6
    assert _usage(client, keys, account, metric="urls")["used"] == 0


def test_usage_refusals(client, keys, account, subtests):
    for q, status, field in [
        ({}, 422, "metric"),
        ({"metric": "urls", "period": "2024-13"}, 422, "period"),
        ({"metric": "urls", "period": "2024-1"}, 422, "period"),
        ({"metric": "urls", "period": "last"}, 422, "period"),
        ({"metric": "urls", "period": "2024-01\n"}, 422, "period"),
        ({"metric": "urls\x00"}, 422, "metric"),
        ({"metric": "urls", "extra": "1"}, 422, "extra"),
    ]:
        with subtests.test(q=q):
            r = client.get(f"/v1/accounts/{account}/usage", query_string=q, headers=keys["product"])
            err = assert_error(r, status, "validation_failed")
            assert field in err["fields"]
    with subtests.test("unknown metric"):  # as a take of it is
        r = client.get(
            f"/v1/accounts/{account}/usage", query_string={"metric": "bananas"}, headers=keys["product"]
        )
        assert "bananas" in assert_error(r, 422, "unknown_metric")["message"]
    with subtests.test("unknown account"):
        r = client.get("/v1/accounts/nobody/usage", query_string={"metric": "urls"}, headers=keys["product"])
        assert_error(r, 404, "unknown_account")

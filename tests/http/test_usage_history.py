"""GET /v1/accounts/{id}/usage/history: one entry per day from the ledger, `used` the counter at the
day's end, which a period's end brings back to 0 (a month, a day) or not (an allocation)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.http.conftest import assert_error, put_account, take


def history(client: Any, keys: Any, metric: str, first: str, last: str, account: str = "acc-1") -> Any:
    return client.get(
        f"/v1/accounts/{account}/usage/history?metric={metric}&from={first}&to={last}",
        headers=keys["product"],
    )


def today() -> datetime:
    return datetime.now(UTC)


def days_from(start: datetime, n: int) -> list[str]:
    return [(start + timedelta(days=i)).date().isoformat() for i in range(n)]


def test_every_day_of_the_range_with_zeros_where_nothing_moved(client, keys, account):
    t = take(client, keys, units=5)
    take(client, keys, units=2)
    client.post(f"/v1/accounts/acc-1/takes/{t['take_id']}/release", headers=keys["product"])
    start = today() - timedelta(days=3)
    end = today() + timedelta(days=2)
    r = history(client, keys, "urls", start.date().isoformat(), end.date().isoformat())
    assert r.status_code == 200, r.json
    assert r.json["metric"] == "urls"
    days = r.json["days"]
    assert [d["date"] for d in days] == days_from(start, 6)
    by_day = {d["date"]: d for d in days}
    now = today().date().isoformat()
    assert by_day[now] == {"date": now, "taken": 7, "released": 5, "used": 2}
    for d in days:
        if d["date"] < now:
            assert (d["taken"], d["released"], d["used"]) == (0, 0, 0)
        elif d["date"] > now:
            # nothing moved; the counter still holds 2 while its month lasts, 0 in the next one
            expected = 2 if d["date"][:7] == now[:7] else 0
            assert (d["taken"], d["released"], d["used"]) == (0, 0, expected)


def test_a_daily_metric_is_back_to_zero_the_next_day_and_an_allocation_is_held(client, keys, account):
    take(client, keys, metric="exports", units=2)
    take(client, keys, metric="seats", units=1)
    now, tomorrow = today().date().isoformat(), (today() + timedelta(days=1)).date().isoformat()
    exports = history(client, keys, "exports", now, tomorrow).json["days"]
    assert [d["used"] for d in exports] == [2, 0]
    seats = history(client, keys, "seats", now, (today() + timedelta(days=40)).date().isoformat()).json[
        "days"
    ]
    assert {d["used"] for d in seats} == {1} and len(seats) == 41


def test_an_admin_reset_shows_as_it_happened(client, keys, account):
    take(client, keys, units=4)
    r = client.post("/v1/admin/accounts/acc-1/reset", json={"metric": "urls"}, headers=keys["admin"])
    assert r.status_code == 200, r.json
    now = today().date().isoformat()
    [day] = history(client, keys, "urls", now, now).json["days"]
    assert (day["taken"], day["used"]) == (4, 0)


def test_refusals(client, keys, account):
    now = today().date()
    ok = history(client, keys, "urls", (now - timedelta(days=399)).isoformat(), now.isoformat())
    assert ok.status_code == 200 and len(ok.json["days"]) == 400
    too_long = history(client, keys, "urls", (now - timedelta(days=400)).isoformat(), now.isoformat())
    assert "to" in assert_error(too_long, 422, "validation_failed")["fields"]
    backwards = history(client, keys, "urls", now.isoformat(), (now - timedelta(days=1)).isoformat())
    assert_error(backwards, 422, "validation_failed")
    assert_error(history(client, keys, "urls", "2026-02-30", now.isoformat()), 422, "validation_failed")
    # the last day there is: its range would end on a day that does not exist (was a 500)
    assert_error(history(client, keys, "urls", "9999-12-31", "9999-12-31"), 422, "validation_failed")
    assert_error(history(client, keys, "nope", now.isoformat(), now.isoformat()), 422, "unknown_metric")
    assert_error(
        history(client, keys, "urls", now.isoformat(), now.isoformat(), "ghost"), 404, "unknown_account"
    )
    missing = client.get("/v1/accounts/acc-1/usage/history?metric=urls", headers=keys["product"])
    assert set(assert_error(missing, 422, "validation_failed")["fields"]) == {"from", "to"}
    finance = client.get(
        f"/v1/accounts/acc-1/usage/history?metric=urls&from={now}&to={now}", headers=keys["finance"]
    )
    assert_error(finance, 403, "forbidden")


def test_an_account_created_just_now_has_zeros(client, keys):
    put_account(client, keys, "acc-2")
    now = today().date().isoformat()
    assert history(client, keys, "urls", now, now, "acc-2").json["days"] == [
        {"date": now, "taken": 0, "released": 0, "used": 0}
    ]

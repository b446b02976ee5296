"""POST /v1/accounts/{id}/takes with `lines` (issue 24): every line or none, the 409 that names
every line that did not fit, the key's replay and reuse, and what the body may not be."""

from __future__ import annotations

from typing import Any

import pytest

from service.quota import periods
from tests.db.helpers import counter, ledger_rows, set_override
from tests.http.conftest import assert_error

LINES = [{"metric": "urls", "units": 3}, {"metric": "exports", "units": 2}, {"metric": "seats"}]


def _post(client: Any, keys: Any, body: Any, account: str = "acc-1") -> Any:
    return client.post(f"/v1/accounts/{account}/takes", json=body, headers=keys["product"])


def test_lines_are_201_with_one_take_per_line_in_order(client, keys, account, conn):
    r = _post(client, keys, {"lines": LINES, "idempotency_key": "order-1"})
    assert r.status_code == 201, r.json
    takes = r.json["takes"]
    assert [{k: v for k, v in t.items() if k != "take_id"} for t in takes] == [
        {"metric": "urls", "units": 3, "used": 3, "limit": 50, "remaining": 47,
         "period": periods.current_period(), "limit_source": "plan", "from_credits": 0},
        {"metric": "exports", "units": 2, "used": 2, "limit": 3, "remaining": 1,
         "period": periods.day_of(periods.now()), "limit_source": "plan", "from_credits": 0},
        {"metric": "seats", "units": 1, "used": 1, "limit": 1, "remaining": 0, "period": None,
         "limit_source": "plan", "from_credits": 0},
    ]  # fmt: skip
    assert sorted(t["take_id"] for t in takes) == sorted(r["id"] for r in ledger_rows(conn, account))
    # each released on its own, by the route that names its account or not
    seats = takes[2]["take_id"]
    released = client.post(f"/v1/accounts/{account}/takes/{seats}/release", headers=keys["product"])
    assert released.json["released"] and counter(conn, account, "seats")["used"] == 0
    assert counter(conn, account, "urls")["used"] == 3


def test_a_line_that_does_not_fit_is_409_naming_every_short_line_and_nothing_moves(
    client, keys, account, conn
):
    set_override(conn, account, "urls", 2)
    r = _post(client, keys, {"lines": [*LINES, {"metric": "api_calls", "units": 10}]})
    err = assert_error(r, 409, "quota_exhausted")
    assert err["lines"] == [
        {"metric": "urls", "units": 3, "remaining": 2, "limit": 2},
    ]
    set_override(conn, account, "seats", 0)
    err = assert_error(_post(client, keys, {"lines": LINES}), 409, "quota_exhausted")
    assert [line["metric"] for line in err["lines"]] == ["urls", "seats"]
    assert ledger_rows(conn, account) == []
    assert {counter(conn, account, m)["used"] for m in ("urls", "exports", "seats", "api_calls")} == {0}


def test_the_same_key_again_is_200_with_the_original_takes(client, keys, account, conn):
    first = _post(client, keys, {"lines": LINES, "idempotency_key": "k"})
    again = _post(client, keys, {"lines": LINES, "idempotency_key": "k"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json == first.json
    assert counter(conn, account, "urls")["used"] == 3


def test_the_key_with_other_lines_or_a_single_take_s_key_is_409_reused(client, keys, account, conn):
    assert _post(client, keys, {"lines": LINES, "idempotency_key": "k"}).status_code == 201
    assert_error(
        _post(client, keys, {"lines": LINES[:2], "idempotency_key": "k"}), 409, "idempotency_key_reused"
    )
    assert_error(_post(client, keys, {"metric": "urls", "units": 3, "idempotency_key": "k"}), 409,
                 "idempotency_key_reused")  # fmt: skip
    assert _post(client, keys, {"metric": "urls", "idempotency_key": "s"}).status_code == 201
    assert_error(_post(client, keys, {"lines": LINES, "idempotency_key": "s"}), 409, "idempotency_key_reused")
    assert counter(conn, account, "urls")["used"] == 4


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"metric": "urls", "lines": LINES}, "metric"),
        ({"lines": []}, "lines"),
        ({"lines": [{"metric": "urls"}] * 2}, "lines"),
        ({"lines": [{"metric": "urls", "units": 1}, {"metric": "urls", "units": 2}]}, "lines"),
        ({"lines": [{"metric": f"m{i}"} for i in range(21)]}, "lines"),
        ({"lines": [{"metric": "urls", "units": 2**31}]}, "lines"),
        ({"lines": [{"metric": "urls", "units": 0}]}, "lines"),
        ({"lines": [{"metric": "urls", "lines": LINES}]}, "lines"),
        ({"lines": [[{"metric": "urls"}]]}, "lines"),
        ({"lines": {"metric": "urls"}}, "lines"),
        ({"lines": LINES, "idempotency_key": "a\x1fb"}, "idempotency_key"),
        ({"metric": "urls", "idempotency_key": "a\x1f2"}, "idempotency_key"),
    ],
    ids=[
        "metric and lines", "no lines", "duplicate metrics", "duplicate metrics, other units", "21 lines",
        "huge units", "zero units", "nested lines", "a line that is a list", "lines an object",
        "a key with U+001F", "a single take's key with U+001F",
    ],
)  # fmt: skip
def test_a_body_the_schema_refuses_is_422_and_nothing_moves(client, keys, account, conn, body, field):
    err = assert_error(_post(client, keys, body), 422, "validation_failed")
    assert any(name.split(".")[0] == field for name in err["fields"]), err
    assert ledger_rows(conn, account) == []


def test_a_line_s_own_field_is_named_by_its_path(client, keys, account):
    err = assert_error(_post(client, keys, {"lines": [{"metric": "urls"}, {"units": "2"}]}), 422)
    assert err["fields"] == {"lines.1.metric": ["Missing data for required field."],
                             "lines.1.units": ["Not a valid integer."]}  # fmt: skip


def test_an_unknown_metric_in_a_line_is_422_unknown_metric(client, keys, account, conn):
    assert_error(_post(client, keys, {"lines": [*LINES, {"metric": "nope"}]}), 422, "unknown_metric")
    assert ledger_rows(conn, account) == []


def test_an_unknown_or_deleted_account_is_refused_as_a_single_take(client, keys, account):
    assert_error(_post(client, keys, {"lines": LINES}, account="ghost"), 404, "unknown_account")
    assert client.delete(f"/v1/admin/accounts/{account}", headers=keys["admin"]).status_code == 200
    assert_error(_post(client, keys, {"lines": LINES}), 410, "account_deleted")

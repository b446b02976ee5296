"""POST /v1/takes/batch (issue 24): each item is exactly a single take (the same answers, counters
and ledger rows as the single route gives, on a twin database), the body's shape is refused whole,
and a bad item is refused on its own while the others go on."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from service.roles import as_login
from tests.conftest import connect, running_app, with_database
from tests.db.helpers import counter, ledger_rows, set_override, set_period, soft_delete
from tests.http.conftest import assert_error, put_account

BATCH = "/v1/takes/batch"

# One sequence of takes: (account, metric, units, key), or a raw item a single take's schema refuses.
# Batches of it end where a test step changes state between them (an override, a deleted account).
SEQUENCE: list[list[dict[str, Any]]] = [
    [
        {"account_id": "a", "metric": "urls"},
        {"account_id": "b", "metric": "urls", "units": 2, "idempotency_key": "k1"},
        {"account_id": "a", "metric": "exports", "units": 2},
        {"account_id": "a", "metric": "seats"},
        {"account_id": "a", "metric": "seats"},  # exhausted: the free plan has 1 seat
        {"account_id": "b", "metric": "urls", "units": 2, "idempotency_key": "k1"},  # replayed
        {"account_id": "b", "metric": "urls", "units": 3, "idempotency_key": "k1"},  # reused
        {"account_id": "a", "metric": "nope"},  # unknown metric
        {"account_id": "ghost", "metric": "urls"},  # unknown account
        {"account_id": "a", "metric": "urls", "units": 0},  # invalid: the single take's 422
        {"account_id": "a b", "metric": "urls"},  # invalid account id
        {"account_id": "a", "metric": "api_calls", "units": 5},  # its counter rolled over first
    ],
    [
        {"account_id": "a", "metric": "urls", "units": 4},  # 3 left after the override below
        {"account_id": "a", "metric": "urls", "units": 3},
        {"account_id": "a", "metric": "urls"},
        {"account_id": "gone", "metric": "urls"},  # deleted
        {"account_id": "b", "metric": "exports", "units": 3, "idempotency_key": "k2"},
        {"account_id": "b", "metric": "exports", "idempotency_key": "k3"},
    ],
]


def _setup(client: Any, keys: Any, conn: Any) -> None:
    for account in ("a", "b", "gone"):
        put_account(client, keys, account)
    set_period(conn, "a", "api_calls", "2020-01")


def _between(conn: Any) -> None:
    set_override(conn, "a", "urls", 4)  # a holds 1: 3 left
    soft_delete(conn, "gone")


def _single(client: Any, keys: Any, item: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in item.items() if k != "account_id"}
    r = client.post(f"/v1/accounts/{item['account_id']}/takes", json=body, headers=keys["product"])
    return {"status": r.status_code, **r.json}


def _batch(client: Any, keys: Any, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = client.post(BATCH, json={"items": items}, headers=keys["product"])
    assert r.status_code == 200, r.json
    results: list[dict[str, Any]] = r.json["results"]
    return results


def _state(conn: Any) -> tuple[Any, Any]:
    """Every counter, and every ledger row with its ids, times and hashes left out."""
    with conn.cursor(row_factory=dict_row) as cur:
        counters = cur.execute(
            "SELECT account_id, metric, period, used, lim FROM quotas ORDER BY 1, 2"
        ).fetchall()
        rows = cur.execute(
            "SELECT account_id, metric, seq, period, kind, units, used_after, lim, limit_source, "
            "idempotency_key, actor FROM ledger ORDER BY account_id, metric, seq"
        ).fetchall()
    return counters, rows


def _by_position(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The answers with each take id replaced by the order in which it first appears."""
    seen: dict[int, int] = {}
    return [
        {**a, "take_id": seen.setdefault(a["take_id"], len(seen))} if "take_id" in a else a for a in answers
    ]


@pytest.fixture
def twin(
    pg_url: str, template_db: str, app_role: tuple[str, str], settings: Any
) -> Iterator[tuple[Any, Any, Any]]:
    """A second fresh database with its own app: (client, keys, owner connection)."""
    from service.keys import create_key

    name = f"ql_twin_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = with_database(pg_url, name)
    try:
        with (
            connect(url) as conn,
            running_app(dataclasses.replace(settings, database_url=as_login(url, *app_role))) as app,
        ):
            keys = {
                "product": {
                    "Authorization": "Bearer " + create_key(conn, name="test-product", role="product")
                }
            }
            yield app.test_client(), keys, conn
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_sequence_taken_one_by_one_and_in_batches_answers_and_writes_the_same(client, keys, conn, twin):
    twin_client, twin_keys, twin_conn = twin
    _setup(client, keys, conn)
    _setup(twin_client, twin_keys, twin_conn)
    singles, batched = [], []
    for n, items in enumerate(SEQUENCE):
        if n:
            _between(conn)
            _between(twin_conn)
        singles += [_single(client, keys, item) for item in items]
        batched += _batch(twin_client, twin_keys, items)
    assert _by_position(batched) == _by_position(singles)
    assert [a["status"] for a in singles] == [
        201, 201, 201, 201, 409, 200, 409, 422, 404, 422, 422, 201, 409, 201, 409, 410, 201, 409,
    ]  # fmt: skip
    assert _state(twin_conn) == _state(conn)
    assert counter(conn, "a", "api_calls")["used"] == 5


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"items": []},
        {"items": {"account_id": "a", "metric": "urls"}},
        {"items": [{"account_id": "a", "metric": "urls"}] * 1001},
        {"items": [{"account_id": "a", "metric": "urls"}, "urls"]},
        {"items": [{"account_id": "a", "metric": "urls"}, [{"account_id": "a", "metric": "urls"}]]},
        {"items": [{"account_id": "a", "metric": "urls"}], "extra": 1},
    ],
    ids=[
        "no items",
        "0 items",
        "items an object",
        "1001 items",
        "an item a string",
        "an item a list",
        "extra",
    ],
)
def test_a_body_of_the_wrong_shape_is_422_and_nothing_is_taken(client, keys, conn, body):
    put_account(client, keys, "a")
    err = assert_error(client.post(BATCH, json=body, headers=keys["product"]), 422, "validation_failed")
    assert err["fields"]
    assert ledger_rows(conn, "a") == []


def test_a_bad_item_gets_the_single_take_s_422_and_the_others_go_on(client, keys, conn):
    put_account(client, keys, "a")
    bad = {"account_id": "a", "metric": "urls", "units": "2", "extra": []}
    results = _batch(
        client, keys, [{"account_id": "a", "metric": "urls"}, bad, {"account_id": "a", "metric": "urls"}]
    )
    single = client.post("/v1/accounts/a/takes", json={"metric": "urls", "units": "2", "extra": []},
                         headers=keys["product"])  # fmt: skip
    assert [r["status"] for r in results] == [201, 422, 201]
    assert results[1] == {"status": 422, **single.json} and set(results[1]["fields"]) == {"units", "extra"}
    assert [r["used"] for r in results[::2]] == [1, 2]
    assert counter(conn, "a", "urls")["used"] == 2


def test_the_batch_is_the_product_key_s(client, keys):
    r = client.post(BATCH, json={"items": [{"account_id": "a", "metric": "urls"}]}, headers=keys["finance"])
    assert_error(r, 403, "forbidden")

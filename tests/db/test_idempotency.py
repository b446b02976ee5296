"""Idempotent takes: one key, one take, one ledger row, one move of the counter, whatever the
concurrency or retries; and a key is bound to what it first took."""

from __future__ import annotations

from typing import Any

import pytest

from service.errors import IdempotencyKeyReused, QuotaExhausted
from service.quota import takes
from tests.db.helpers import assert_counter_matches_ledger, counter, ledger_rows, new_account, set_override
from tests.db.race import race

METRIC = "urls"


def _fields(t: takes.Take) -> tuple[Any, ...]:
    return (t.take_id, t.metric, t.units, t.used, t.limit, t.period, t.limit_source)


def test_20_concurrent_takes_with_one_key_make_one_take(conn, plans, connect):
    account = new_account(conn, plans)
    conns = connect(20)

    results = race(
        conns,
        lambda c: takes.take(
            c, plans, account_id=account, metric=METRIC, units=3, idempotency_key="k1", actor="t"
        ),
    )

    assert [r for r in results if isinstance(r, BaseException)] == []
    assert len({_fields(r) for r in results}) == 1, "every caller gets the same take"
    assert sum(not r.replayed for r in results) == 1
    assert counter(conn, account, METRIC)["used"] == 3
    rows = ledger_rows(conn, account, METRIC)
    assert [(r["kind"], r["units"], r["idempotency_key"]) for r in rows] == [("take", 3, "k1")]
    assert results[0].take_id == rows[0]["id"]


def test_concurrent_keys_on_a_busy_counter_each_move_it_once(conn, plans, connect):
    """10 keys x 4 callers each, all at once: 10 takes, each key's callers agree."""
    account = new_account(conn, plans)
    conns = connect(40)
    by_conn = {id(c): f"key-{i % 10}" for i, c in enumerate(conns)}

    results = race(
        conns,
        lambda c: takes.take(
            c, plans, account_id=account, metric=METRIC, idempotency_key=by_conn[id(c)], actor="t"
        ),
    )

    assert [r for r in results if isinstance(r, BaseException)] == []
    per_key: dict[str, set[Any]] = {}
    for c, r in zip(conns, results, strict=True):
        per_key.setdefault(by_conn[id(c)], set()).add(_fields(r))
    assert all(len(v) == 1 for v in per_key.values())
    assert counter(conn, account, METRIC)["used"] == 10
    assert len(ledger_rows(conn, account, METRIC, kind="take")) == 10
    assert_counter_matches_ledger(conn, account, METRIC)


def test_sequential_retries_return_the_original(conn, plans):
    account = new_account(conn, plans)
    first = takes.take(
        conn, plans, account_id=account, metric=METRIC, units=2, idempotency_key="k", actor="t"
    )
    other = takes.take(
        conn, plans, account_id=account, metric=METRIC, units=1, actor="t"
    )  # moves the counter
    retries = [
        takes.take(conn, plans, account_id=account, metric=METRIC, units=2, idempotency_key="k", actor="t")
        for _ in range(20)
    ]

    assert not first.replayed and all(r.replayed for r in retries)
    assert {_fields(r) for r in retries} == {_fields(first)}
    assert retries[0].used == 2, "the original's counter value, not today's"
    assert counter(conn, account, METRIC)["used"] == 3
    assert [r["id"] for r in ledger_rows(conn, account, METRIC)] == [first.take_id, other.take_id]


def test_same_key_after_quota_exhausted_returns_the_original(conn, plans):
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 2)
    first = takes.take(conn, plans, account_id=account, metric=METRIC, idempotency_key="k", actor="t")
    takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    with pytest.raises(QuotaExhausted):
        takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")

    again = takes.take(conn, plans, account_id=account, metric=METRIC, idempotency_key="k", actor="t")

    assert again.replayed and _fields(again) == _fields(first)
    assert counter(conn, account, METRIC)["used"] == 2
    assert len(ledger_rows(conn, account)) == 2


@pytest.mark.parametrize(("metric", "units"), [("seats", 1), (METRIC, 2)])
def test_key_reused_for_a_different_take_is_refused(conn, plans, metric, units):
    account = new_account(conn, plans)
    first = takes.take(conn, plans, account_id=account, metric=METRIC, idempotency_key="k", actor="t")

    with pytest.raises(IdempotencyKeyReused) as e:
        takes.take(
            conn, plans, account_id=account, metric=metric, units=units, idempotency_key="k", actor="t"
        )

    assert e.value.details == {"take_id": first.take_id}
    assert counter(conn, account, METRIC)["used"] == 1
    assert counter(conn, account, "seats")["used"] == 0
    assert len(ledger_rows(conn, account)) == 1


def test_keys_are_per_account(conn, plans):
    a, b = new_account(conn, plans), new_account(conn, plans)
    ta = takes.take(conn, plans, account_id=a, metric=METRIC, idempotency_key="same", actor="t")
    tb = takes.take(conn, plans, account_id=b, metric=METRIC, idempotency_key="same", actor="t")
    assert not tb.replayed and ta.take_id != tb.take_id
    assert counter(conn, b, METRIC)["used"] == 1


def test_failed_statement_leaves_counter_untouched(conn, plans):
    """The take statement's ledger insert fails on the duplicate key: its counter update must roll
    back with it (else a duplicate would move the counter without a ledger row), over many attempts."""
    account = new_account(conn, plans)
    takes.take(conn, plans, account_id=account, metric=METRIC, idempotency_key="k", actor="t")
    for _ in range(200):
        takes.take(conn, plans, account_id=account, metric=METRIC, idempotency_key="k", actor="t")
    assert counter(conn, account, METRIC)["used"] == 1
    assert_counter_matches_ledger(conn, account, METRIC)

"""The batch's database side (issue 24): `db.pipelined` sends every statement in one round trip, each
its own transaction, and one that fails leaves the others be; `takes.take_each` answers each item as
its single take would, with items of many accounts taken from many connections at once."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.rows import dict_row, tuple_row

from service.db import pipelined
from service.errors import IdempotencyKeyReused, QuotaExhausted, UnknownAccount, UnknownMetric
from service.quota import takes
from service.quota.takes import TakeItem
from tests.db.helpers import assert_counter_matches_ledger, counter, new_account, set_override
from tests.db.race import race


def test_each_pipelined_statement_is_its_own_transaction_and_a_failure_stops_no_other(conn):
    answers = pipelined(
        conn,
        "SELECT pg_current_xact_id()::text::bigint AS xact, 1 / %(d)s AS q",
        [{"d": 1}, {"d": 0}, {"d": 1}, {"d": 0}, {"d": 1}],
        row_factory=dict_row,
    )
    assert [a is None for a in answers] == [False, True, False, True, False]
    xacts = [a[0]["xact"] for a in answers if a is not None]
    assert len(set(xacts)) == 3
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection is idle again


def test_nothing_to_send_sends_nothing(conn):
    assert pipelined(conn, "SELECT 1", [], row_factory=tuple_row) == []


@pytest.mark.parametrize("delegated", [False, True], ids=["one PostgreSQL", "as on Citus"])
def test_each_item_is_answered_as_its_single_take(conn, plans, monkeypatch, delegated):
    """Also as on Citus, where the items send take_delegated (which one PostgreSQL has too)."""
    monkeypatch.setattr(takes, "on_citus", lambda conn: delegated)
    a, b = new_account(conn, plans), new_account(conn, plans)
    set_override(conn, b, "urls", 2)
    items = [
        TakeItem(account_id=a, metric="urls", idempotency_key="k"),
        TakeItem(account_id=b, metric="urls", units=3),
        TakeItem(account_id="ghost", metric="urls"),
        TakeItem(account_id=a, metric="nope"),
        TakeItem(account_id=a, metric="urls", idempotency_key="k"),
        TakeItem(account_id=a, metric="urls", units=2, idempotency_key="k"),
        TakeItem(account_id=b, metric="urls", units=2),
    ]
    got = takes.take_each(conn, plans, items, actor="t")
    assert [type(r).__name__ for r in got] == [
        "Take", "QuotaExhausted", "UnknownAccount", "UnknownMetric", "Take", "IdempotencyKeyReused", "Take",
    ]  # fmt: skip
    first, exhausted, unknown, metric, again, reused, fits = got
    assert isinstance(first, takes.Take) and isinstance(again, takes.Take) and again.replayed
    assert again.take_id == first.take_id
    # As the counter stood when the item was refused; on Citus, as it stands after the batch (the
    # later item took the 2 left), as a single take's refusal is read after the fact.
    assert isinstance(exhausted, QuotaExhausted) and exhausted.details["remaining"] == (0 if delegated else 2)
    assert isinstance(unknown, UnknownAccount) and isinstance(metric, UnknownMetric)
    assert isinstance(reused, IdempotencyKeyReused) and reused.details["take_id"] == first.take_id
    assert isinstance(fits, takes.Take) and fits.used == 2
    assert (counter(conn, a, "urls")["used"], counter(conn, b, "urls")["used"]) == (1, 2)


def test_batches_over_the_same_accounts_from_many_connections_never_overshoot(conn, plans, connect):
    """Every connection sends one batch of a take on each of ten accounts, half of them in the
    opposite order: a batch is one transaction that locks its counters in (account, metric) order
    whatever the item order, so no two batches wait on each other in a cycle, and the limits hold."""
    accounts = [new_account(conn, plans) for _ in range(10)]
    for account in accounts:
        set_override(conn, account, "urls", 15)
    conns = connect(24)
    forward = [TakeItem(account_id=account, metric="urls") for account in accounts]
    order = {id(c): forward if i % 2 else forward[::-1] for i, c in enumerate(conns)}

    def batch(c: Any) -> list[Any]:
        return takes.take_each(c, plans, order[id(c)], actor="race")

    results = race(conns, batch)
    assert [r for r in results if isinstance(r, BaseException)] == []
    answers = [a for r in results if isinstance(r, list) for a in r]
    assert sum(isinstance(a, takes.Take) for a in answers) == 150
    assert sum(isinstance(a, QuotaExhausted) for a in answers) == 24 * 10 - 150
    for account in accounts:
        assert assert_counter_matches_ledger(conn, account, "urls")["used"] == 15


def test_a_thousand_items_with_refusals_and_replays_among_them(conn, plans):
    """The batch's largest size, so that the pipeline's buffers fill while it is sent and results
    (errors among them: keys met again) are read back before the last statement goes."""
    accounts = [new_account(conn, plans) for _ in range(5)]
    for account in accounts:
        set_override(conn, account, "urls", 150)
    items = [
        TakeItem(account_id=accounts[i % 5], metric="urls", idempotency_key=f"k{i % 400}")
        for i in range(1000)
    ]
    got = takes.take_each(conn, plans, items, actor="t")
    assert len(got) == 1000
    assert all(isinstance(r, takes.Take) for r in got)  # keys k0..k399: 400 takes, then their replays
    assert sum(r.replayed for r in got if isinstance(r, takes.Take)) == 600
    assert sorted(counter(conn, a, "urls")["used"] for a in accounts) == [80] * 5


def test_a_single_and_a_multi_line_take_racing_for_one_key_never_both_win(conn, plans, connect):
    """The key's first row is the single take's and the multi-line take's alike, so the unique index
    lets one of them through and the other meets it: replayed if it asked the same, else 409."""
    account = new_account(conn, plans)
    lines = [takes.Line(metric="urls", units=2), takes.Line(metric="seats")]
    conns = connect(20)
    multi = {id(c) for c in conns[::2]}

    def one(c: Any) -> str:
        try:
            if id(c) in multi:
                takes.take_lines(c, plans, account_id=account, lines=lines, idempotency_key="k", actor="t")
                return "lines"
            takes.take(c, plans, account_id=account, metric="seats", idempotency_key="k", actor="t")
            return "single"
        except IdempotencyKeyReused:
            return "reused"

    results = race(conns, one)
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert set(results) in ({"lines", "reused"}, {"single", "reused"})
    took = counter(conn, account, "urls")["used"], counter(conn, account, "seats")["used"]
    assert took == ((2, 1) if "lines" in results else (0, 1))


def test_a_batch_is_one_transaction_and_one_statement(conn, plans):
    """What makes a batch cheaper than its takes one by one: one commit for all of its items."""
    accounts = [new_account(conn, plans) for _ in range(3)]
    items = [TakeItem(account_id=accounts[i % 3], metric="urls") for i in range(9)]
    got = takes.take_each(conn, plans, items, actor="t")
    assert all(isinstance(r, takes.Take) and not r.replayed for r in got)
    ids = [r.take_id for r in got if isinstance(r, takes.Take)]
    xacts = conn.execute("SELECT DISTINCT xmin::text FROM ledger WHERE id = ANY(%s)", (ids,)).fetchall()
    assert len(xacts) == 1


def test_a_key_taken_while_the_batch_runs_undoes_it_and_the_items_go_one_by_one(conn, plans, connect):
    """The batch looks a key up before its take; a take of that key committed in between makes the
    batch's INSERT meet it (a unique violation), which undoes the whole statement. The items are
    then taken one by one: the keyed one answers the other take (replayed), the others are taken
    once, and no counter moved twice."""
    a, b = new_account(conn, plans), new_account(conn, plans)
    other, batch_conn = connect(2)
    with other.transaction():
        mine = takes.take(other, plans, account_id=a, metric="urls", idempotency_key="k", actor="other")
        waiting = {}

        def run_batch() -> None:
            items = [
                TakeItem(account_id=b, metric="urls"),
                TakeItem(account_id=a, metric="urls", idempotency_key="k"),
                TakeItem(account_id=b, metric="urls", units=2),
            ]
            waiting["got"] = takes.take_each(batch_conn, plans, items, actor="t")

        import threading
        import time

        t = threading.Thread(target=run_batch)
        t.start()
        # the batch's INSERT of key k waits on the uncommitted row of this transaction
        deadline = time.monotonic() + 10
        while not conn.execute(
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock')",
            (batch_conn.info.backend_pid,),
        ).fetchone()[0]:
            assert time.monotonic() < deadline, "the batch never waited on the key"
            time.sleep(0.02)
    t.join(10)
    first, keyed, second = waiting["got"]
    assert isinstance(keyed, takes.Take) and keyed.replayed and keyed.take_id == mine.take_id
    assert isinstance(first, takes.Take) and isinstance(second, takes.Take) and second.used == 3
    assert assert_counter_matches_ledger(conn, a, "urls")["used"] == 1
    assert assert_counter_matches_ledger(conn, b, "urls")["used"] == 3


def test_batches_and_multi_line_takes_in_opposite_orders_never_deadlock(conn, plans, connect):
    """Batches lock in (account, metric) order and a multi-line take its account's counters in
    metric order: the same order, so neither waits on the other in a cycle whatever the request
    order (a deadlock would undo a batch and fail a multi-line take)."""
    accounts = [new_account(conn, plans) for _ in range(4)]
    conns = connect(16)
    lines = [takes.Line(metric="seats"), takes.Line(metric="urls")]
    batch = [TakeItem(account_id=x, metric=m) for x in accounts for m in ("urls", "seats")]
    for x in accounts:
        set_override(conn, x, "seats", 1000)

    def one(c: Any) -> Any:
        i = conns.index(c)
        if i % 2:
            return takes.take_each(c, plans, batch if i % 4 == 1 else batch[::-1], actor="t")
        return takes.take_lines(
            c, plans, account_id=accounts[i // 2 % 4], lines=lines[:: 1 if i % 3 else -1], actor="t"
        )

    results = race(conns, one)
    assert [r for r in results if isinstance(r, BaseException)] == []
    deadlocks = conn.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()[0]
    assert deadlocks == 0
    for x in accounts:
        assert assert_counter_matches_ledger(conn, x, "urls")["used"] == 8 + 2
        assert assert_counter_matches_ledger(conn, x, "seats")["used"] == 8 + 2

"""The ledger's hash chain (migrations/0009, 0015, service/quota/chain.py): every writer chains its row
in its own statement at the next position of its counter (seq), the SQL and Python forms of the hash
agree, a concurrent workload leaves a chain that verifies, and a row changed, removed, inserted or
moved behind the triggers' back is named."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import namedtuple_row

from service.errors import QuotaExhausted
from service.quota import admin, chain, periods, reset, takes
from tests.citus import on_cluster
from tests.db.helpers import new_account, set_override, set_period
from tests.db.race import race

METRIC = "urls"
PERIOD = periods.current_period()
EARLIER = "2001-01"


def rows(conn: Any, account_id: str, metric: str = METRIC) -> list[Any]:
    with conn.cursor(row_factory=namedtuple_row) as cur:
        return cur.execute(
            "SELECT * FROM ledger WHERE account_id = %s AND metric = %s ORDER BY seq", (account_id, metric)
        ).fetchall()


def head(conn: Any, account_id: str, metric: str = METRIC) -> tuple[Any, ...]:
    return conn.execute(
        "SELECT chain_id, chain_hash FROM quotas WHERE account_id = %s AND metric = %s", (account_id, metric)
    ).fetchone()


def assert_chained(conn: Any, account_id: str, metric: str = METRIC) -> list[Any]:
    """Every row links to the one before it in seq order (1, 2, 3 ...), its hash is the documented form
    of its fields (computed here in Python), and the counter's head is its last row."""
    chain_rows = rows(conn, account_id, metric)
    prev = None
    for n, r in enumerate(chain_rows, start=1):
        assert r.seq == n, r
        assert r.prev_hash == prev, r
        assert r.hash == chain.row_hash(prev, r), r
        prev = r.hash
    (chain_seq,) = conn.execute(
        "SELECT chain_seq FROM quotas WHERE account_id = %s AND metric = %s", (account_id, metric)
    ).fetchone()
    assert chain_seq == len(chain_rows)
    if chain_rows:
        assert head(conn, account_id, metric) == (chain_rows[-1].id, chain_rows[-1].hash)
    return chain_rows


def tamper(conn: Any, sql: str, *params: object) -> None:
    """Change the ledger as a superuser would, with the append-only triggers bypassed. On Citus the
    triggers run on the shards, so the setting goes with this transaction's connections to the
    workers (citus.propagate_set_commands; on one PostgreSQL that setting is only stored)."""
    with conn.transaction():
        conn.execute("SET LOCAL citus.propagate_set_commands = 'local'")
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(sql, params)


# --- the form --------------------------------------------------------------------------------------


def test_sql_and_python_hash_agree_including_nulls_and_any_text(conn: Any) -> None:
    cases = [
        (None, 1, "acc-1", "urls", "2026-11", "take", 1, 1, 50, None, None, "key-1"),
        (b"\x01" * 32, 2, "a:b@c", "ünïcode", "2026-12", "release", 3, 0, None, 1, None, "system:x"),
        (b"\xff" * 32, 3, "acc", "m", "2026-12", "take", 7, 7, None, None, "ключ:1:é\n,\"'", "k"),
        (None, 4, "acc", "m", "2026-12", "take", 7, 7, None, None, "", "k"),
    ]
    at = datetime(2026, 11, 30, 19, 17, 10, 123456, tzinfo=UTC)
    for prev, *fields in cases:
        (sql,) = conn.execute(
            "SELECT ledger_hash(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (prev, fields[0], at, *fields[1:]),
        ).fetchone()
        names = "id account_id metric period kind units used_after lim take_id idempotency_key actor"
        row = type("Row", (), dict(zip(names.split(), fields, strict=True), at=at))
        assert sql == chain.row_hash(prev, row), fields


def test_the_documented_example() -> None:
    """The worked example in the README, so that it cannot drift from the code."""
    row = type(
        "Row",
        (),
        {
            "id": 42,
            "at": datetime(2026, 11, 30, 12, 0, 0, 500000, tzinfo=UTC),
            "account_id": "acc_1",
            "metric": "urls",
            "period": "2026-11",
            "kind": "take",
            "units": 1,
            "used_after": 7,
            "lim": 500,
            "take_id": None,
            "idempotency_key": None,
            "actor": "web",
        },
    )
    assert chain.canonical(row) == b"2:4216:17960400005000005:acc_14:urls7:2026-114:take1:11:73:500::3:web"
    assert chain.row_hash(None, row).hex() == EXAMPLE_HASH


EXAMPLE_HASH = "be22768285b145b72fe25679ecf2da63878bf7e1e2b5898d296c868e00733f8d"


# --- every writer chains ---------------------------------------------------------------------------


def test_take_chains(conn: Any, plans: Any) -> None:
    account = new_account(conn, plans)
    for key in (None, "k-1", None):
        takes.take(conn, plans, account_id=account, metric=METRIC, idempotency_key=key, actor="t")
    got = assert_chained(conn, account)
    assert [r.kind for r in got] == ["take"] * 3 and got[0].prev_hash is None


def test_a_refused_or_replayed_take_leaves_the_chain_alone(conn: Any, plans: Any) -> None:
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 1)
    takes.take(conn, plans, account_id=account, metric=METRIC, idempotency_key="k", actor="t")
    before = head(conn, account)
    takes.take(conn, plans, account_id=account, metric=METRIC, idempotency_key="k", actor="t")
    with pytest.raises(QuotaExhausted):
        takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    assert head(conn, account) == before
    assert len(assert_chained(conn, account)) == 1


def test_release_chains(conn: Any, plans: Any) -> None:
    account = new_account(conn, plans)
    t = takes.take(conn, plans, account_id=account, metric=METRIC, units=2, actor="t")
    assert takes.release(conn, take_id=t.take_id, actor="r").released
    got = assert_chained(conn, account)
    assert [(r.kind, r.take_id) for r in got] == [("take", None), ("release", t.take_id)]


def test_lazy_rollover_chains(conn: Any, plans: Any) -> None:
    account = new_account(conn, plans)
    takes.take(conn, plans, account_id=account, metric=METRIC, units=3, actor="t")
    set_period(conn, account, METRIC, EARLIER)
    takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    got = assert_chained(conn, account)
    assert [(r.kind, r.units, r.actor) for r in got] == [
        ("take", 3, "t"),
        ("reset", 3, takes.ROLLOVER_ACTOR),
        ("take", 1, "t"),
    ]


def test_monthly_reset_batches_chain(conn: Any, plans: Any) -> None:
    used, idle = new_account(conn, plans), new_account(conn, plans)
    takes.take(conn, plans, account_id=used, metric=METRIC, units=2, actor="t")
    for account in (used, idle):
        for metric in plans.metrics:
            set_period(conn, account, metric, EARLIER)
    idle_head = head(conn, idle)
    outcome = reset.reset_month(conn, period=PERIOD, batch_size=1)
    assert outcome.status == "done" and outcome.reset_rows == 1
    got = assert_chained(conn, used)
    assert [(r.kind, r.units, r.actor) for r in got] == [("take", 2, "t"), ("reset", 2, reset.ACTOR)]
    assert head(conn, idle) == idle_head == (None, None)  # nothing cleared, no row, no chain


def test_admin_reset_chains(conn: Any, plans: Any) -> None:
    account = new_account(conn, plans)
    takes.take(conn, plans, account_id=account, metric=METRIC, units=4, actor="t")
    assert admin.reset_counter(conn, plans, account_id=account, metric=METRIC, actor="ops") == 4
    takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    got = assert_chained(conn, account)
    expected = [("take", 4, "t"), ("reset", 4, "ops"), ("take", 1, "t")]
    assert [(r.kind, r.units, r.actor) for r in got] == expected


def test_every_writer_chains_as_the_application_role(conn: Any, plans: Any, as_service: Any) -> None:
    """quota_app may only SELECT and INSERT on the ledger; drawing the row's id needs the sequence."""
    account = new_account(conn, plans)
    with as_service(conn):
        t = takes.take(conn, plans, account_id=account, metric=METRIC, units=2, actor="t")
        takes.release(conn, take_id=t.take_id, actor="t")
        takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
        admin.reset_counter(conn, plans, account_id=account, metric=METRIC, actor="ops")
        takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    set_period(conn, account, METRIC, EARLIER)
    with as_service(conn):
        assert reset.reset_month(conn, period=PERIOD).status == "done"
    assert len(assert_chained(conn, account)) == 6
    assert chain.verify(conn).ok


# --- verify ----------------------------------------------------------------------------------------


def _workload(accounts: list[str], plans: Any) -> Any:
    def work(c: Any) -> int:
        rnd = random.Random(id(c))
        done = 0
        for i in range(25):
            account = rnd.choice(accounts)
            metric = rnd.choice(list(plans.metrics))
            try:
                t = takes.take(c, plans, account_id=account, metric=metric, actor="w")
                done += 1
                if i % 3 == 0:
                    takes.release(c, take_id=t.take_id, actor="w")
                if i % 11 == 0:
                    admin.reset_counter(c, plans, account_id=account, metric=METRIC, actor="ops")
            except QuotaExhausted:
                pass
        return done

    return work


def test_verify_passes_after_a_concurrent_workload(conn: Any, plans: Any, connect: Any) -> None:
    """Takes, releases, lazy rollovers and admin resets from 16 connections on a few hot counters:
    each row must take the next position of its counter's chain, whatever the lock waits."""
    accounts = [new_account(conn, plans) for _ in range(3)]
    for a in accounts:
        set_override(conn, a, METRIC, 40)
        for metric in plans.metrics:
            takes.take(conn, plans, account_id=a, metric=metric, actor="before")
            set_period(conn, a, metric, EARLIER)  # the racing takes open the month

    results = race(connect(16), _workload(accounts, plans))

    assert [r for r in results if isinstance(r, BaseException)] == []
    result = chain.verify(conn)
    assert result.ok, result.findings
    assert result.rows == conn.execute("SELECT count(*) FROM ledger").fetchone()[0] > 300
    kinds = {r[0] for r in conn.execute("SELECT DISTINCT kind FROM ledger").fetchall()}
    assert kinds == {"take", "release", "reset"}
    opened = conn.execute("SELECT count(*) FROM ledger WHERE idempotency_key LIKE 'period-open:%'").fetchone()
    assert opened == (len(accounts) * len(plans.metrics),)
    for a in accounts:
        for metric in plans.metrics:
            assert_chained(conn, a, metric)


def test_release_racing_an_admin_reset_of_its_counter(conn: Any, plans: Any, connect: Any) -> None:
    """Found by the workload above: Postgres checks the quota_units domain while it evaluates SET on
    the row version its snapshot saw, before it re-evaluates on the locked newest one, so a release
    whose counter an admin reset meanwhile failed spuriously (see the `release` statement)."""
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, None)

    def release_loop(c: Any) -> int:
        n = 0
        for _ in range(60):
            t = takes.take(c, plans, account_id=account, metric=METRIC, units=2, actor="t")
            n += takes.release(c, take_id=t.take_id, actor="r").released
        return n

    def reset_loop(c: Any) -> int:
        for _ in range(60):
            admin.reset_counter(c, plans, account_id=account, metric=METRIC, actor="ops")
        return 0

    conns = connect(4)
    results = race(conns, lambda c: reset_loop(c) if c is conns[0] else release_loop(c))

    assert [r for r in results if isinstance(r, BaseException)] == []
    assert chain.verify(conn).ok
    assert conn.execute(
        "SELECT min(used_after) >= 0 FROM ledger WHERE account_id = %s", (account,)
    ).fetchone() == (True,)


def test_a_changed_field_is_named(conn: Any, plans: Any) -> None:
    good, bad = new_account(conn, plans), new_account(conn, plans)
    for a in (good, bad):
        for _ in range(3):
            takes.take(conn, plans, account_id=a, metric=METRIC, actor="t")
    target = rows(conn, bad)[1]
    tamper(conn, "UPDATE ledger SET units = 5 WHERE id = %s", target.id)

    result = chain.verify(conn)

    assert not result.ok
    [finding] = result.findings
    assert (finding.account_id, finding.metric, finding.row_id) == (bad, METRIC, target.id)
    assert "fields do not match the row's hash" in finding.problem
    assert "units 5 / used_after 2 do not follow" in finding.problem
    assert result.rows == 6


def test_a_removed_row_breaks_the_next_link_and_a_removed_last_row_the_head(conn: Any, plans: Any) -> None:
    middle, tail = new_account(conn, plans), new_account(conn, plans)
    for a in (middle, tail):
        for _ in range(3):
            takes.take(conn, plans, account_id=a, metric=METRIC, actor="t")
    m, t = rows(conn, middle), rows(conn, tail)
    tamper(conn, "DELETE FROM ledger WHERE id = %s OR id = %s", m[1].id, t[2].id)

    found = {f.account_id: f for f in chain.verify(conn).findings}

    assert found[middle].row_id == m[2].id and "previous row" in found[middle].problem
    assert found[tail].row_id is None and f"names row {t[2].id}" in found[tail].problem


def test_an_inserted_row_is_named(conn: Any, plans: Any) -> None:
    account = new_account(conn, plans)
    takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    first = rows(conn, account)[0]
    tamper(
        conn,
        "INSERT INTO ledger (seq, account_id, metric, period, kind, units, used_after, actor, prev_hash,"
        " hash) VALUES (2, %s, %s, %s, 'take', 1, 2, 'forger', %s, %s)",
        account,
        METRIC,
        PERIOD,
        first.hash,
        b"\x00" * 32,
    )
    [finding] = chain.verify(conn).findings
    assert finding.row_id == rows(conn, account)[1].id and "fields do not match" in finding.problem


def test_the_whole_ledger_is_walked_in_pages_of_whole_accounts(
    conn: Any, plans: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of two accounts: every row is walked once, a break on a later page is found, and so is
    a row of an account id that accounts does not hold, past the last page's end."""
    monkeypatch.setattr(chain, "PAGE_ACCOUNTS", 2)
    accounts = sorted(new_account(conn, plans) for _ in range(4))
    for a in accounts:
        for _ in range(3):
            takes.take(conn, plans, account_id=a, metric=METRIC, actor="t")
    assert chain.verify(conn).ok and chain.verify(conn).rows == 12
    tamper(conn, "UPDATE ledger SET units = 5 WHERE id = %s", rows(conn, accounts[3])[1].id)
    tamper(
        conn,
        "INSERT INTO ledger (seq, account_id, metric, period, kind, units, used_after, actor, hash)"
        " VALUES (1, 'zzz-no-such-account', %s, %s, 'take', 1, 1, 'forger', %s)",
        METRIC,
        PERIOD,
        b"\x00" * 32,
    )

    result = chain.verify(conn)

    assert (result.accounts, result.rows) == (5, 13)
    assert [(f.account_id, f.row_id is not None) for f in result.findings] == [
        (accounts[3], True),
        ("zzz-no-such-account", True),
    ]


def test_verify_one_account_and_since(conn: Any, plans: Any) -> None:
    a, b = new_account(conn, plans), new_account(conn, plans)
    for _ in range(3):
        for x in (a, b):
            takes.take(conn, plans, account_id=x, metric=METRIC, actor="t")
    ids = [r.id for r in rows(conn, a)]
    assert chain.verify(conn, account_id=a).rows == 3
    since = chain.verify(conn, since=ids[1])
    # each counter from its first row with id >= since to its head (on one PostgreSQL, 2 rows of
    # each account; on Citus, b's ids may come from another worker's range, lower or higher)
    expected = 0
    for x in (a, b):
        chain_ids = [r.id for r in rows(conn, x)]
        starts = [i for i, row_id in enumerate(chain_ids) if row_id >= ids[1]]
        expected += len(chain_ids) - starts[0] if starts else 0
    assert since.ok and since.rows == expected
    if not on_cluster():
        assert expected == 4

    tamper(conn, "UPDATE ledger SET prev_hash = %s WHERE id = %s", b"\x00" * 32, ids[1])
    assert [f.row_id for f in chain.verify(conn, since=ids[1]).findings] == [ids[1]]
    assert chain.verify(conn, account_id=b).ok
    assert chain.verify(conn, since=ids[2]).ok  # the broken link is before the walk


def test_ledger_ids_need_only_be_unique(conn: Any, plans: Any) -> None:
    """The chain is ordered by seq, not by id: a row whose id is lower than its counter's head (as a
    Citus worker draws from its own range of the sequence) chains and verifies."""
    account = new_account(conn, plans)
    (low,) = conn.execute("SELECT coalesce(max(id), 0) FROM ledger").fetchone()
    conn.execute("SELECT setval('ledger_id_seq', %s)", (low + 1_000_000,))
    for _ in range(2):
        takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    conn.execute("SELECT setval('ledger_id_seq', %s)", (low + 1,))
    takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    got = assert_chained(conn, account)
    if not on_cluster():  # there the take draws its id on the account's worker (migrations/0015)
        assert got[2].id < got[1].id
    assert chain.verify(conn).ok
    since = chain.verify(conn, since=got[1].id)  # from the second row on, the third's lower id too
    assert since.ok and since.rows == 2


def _three_takes(conn: Any, plans: Any) -> tuple[str, list[Any]]:
    account = new_account(conn, plans)
    for _ in range(3):
        takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    return account, rows(conn, account)


def test_a_gap_in_seq_is_named(conn: Any, plans: Any) -> None:
    account, got = _three_takes(conn, plans)
    tamper(conn, "UPDATE ledger SET seq = 7 WHERE account_id = %s AND id = %s", account, got[2].id)
    [finding] = chain.verify(conn).findings
    assert finding.row_id == got[2].id and "seq 7 where 3 was expected" in finding.problem


def test_a_repeated_seq_is_named(conn: Any, plans: Any) -> None:
    account, got = _three_takes(conn, plans)
    conn.execute("DROP INDEX ledger_chain_seq")  # as a superuser could, to write a repeat
    tamper(conn, "UPDATE ledger SET seq = 2 WHERE account_id = %s AND id = %s", account, got[2].id)
    [finding] = chain.verify(conn).findings
    assert finding.row_id in (got[1].id, got[2].id)


def test_rows_moved_in_seq_are_named(conn: Any, plans: Any) -> None:
    """Two rows swapping places: their hashes are intact, their links are not."""
    account, got = _three_takes(conn, plans)
    for seq, row in ((1000, got[1]), (2, got[2]), (3, got[1])):
        tamper(conn, "UPDATE ledger SET seq = %s WHERE account_id = %s AND id = %s", seq, account, row.id)
    [finding] = chain.verify(conn).findings
    assert finding.row_id == got[2].id and "previous row" in finding.problem


def test_a_rewritten_head_position_is_named(conn: Any, plans: Any) -> None:
    account, _ = _three_takes(conn, plans)
    conn.execute("UPDATE quotas SET chain_seq = 9 WHERE account_id = %s AND metric = %s", (account, METRIC))
    [finding] = chain.verify(conn).findings
    assert finding.row_id is None and "seq 9" in finding.problem


def test_a_row_without_hash_is_refused(conn: Any, plans: Any) -> None:
    account = new_account(conn, plans)
    with pytest.raises(psycopg.errors.NotNullViolation):
        conn.execute(
            "INSERT INTO ledger (account_id, metric, period, kind, units, used_after, actor)"
            " VALUES (%s, %s, %s, 'take', 1, 1, 'x')",
            (account, METRIC, PERIOD),
        )

"""The ledger's hash chain (migrations/0009, 0015, service/quota/chain.py): every writer chains its row
in its own statement at the next position of its counter (seq), the SQL and Python forms of the hash
agree, a concurrent workload leaves a chain that verifies, and a row changed, removed, inserted or
moved behind the triggers' back is named."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import namedtuple_row

from service.errors import QuotaExhausted
from service.quota import admin, chain, periods, reset, takes
from tests.citus import on_cluster
from tests.db.helpers import monthly_metrics, new_account, set_override, set_period
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


def problems(result: chain.Verification) -> dict[str, list[tuple[str, int | None, str]]]:
    """account -> [(metric, row id or None for the head, problem)] of a verification's findings."""
    out: dict[str, list[tuple[str, int | None, str]]] = {}
    for f in result.findings:
        out.setdefault(f.account_id, []).append((f.metric, f.row_id, f.problem))
    return out


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
        for metric in monthly_metrics(plans):
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
            metric = rnd.choice(monthly_metrics(plans))
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
        for metric in monthly_metrics(plans):
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
    assert opened == (len(accounts) * len(monthly_metrics(plans)),)
    for a in accounts:
        for metric in monthly_metrics(plans):
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
    assert {(f.account_id, f.metric, f.row_id) for f in result.findings} == {(bad, METRIC, target.id)}
    [hashed, numbers] = [f.problem for f in result.findings]
    assert "fields do not match the row's hash" in hashed
    assert "used_after 2 does not follow from row" in numbers and "a take of 5 leaves 6" in numbers
    assert (result.rows, result.breaks, result.broken_accounts) == (6, 2, 1)


def test_a_removed_row_breaks_the_next_link_and_a_removed_last_row_the_head(conn: Any, plans: Any) -> None:
    middle, tail = new_account(conn, plans), new_account(conn, plans)
    for a in (middle, tail):
        for _ in range(3):
            takes.take(conn, plans, account_id=a, metric=METRIC, actor="t")
    m, t = rows(conn, middle), rows(conn, tail)
    tamper(conn, "DELETE FROM ledger WHERE id = %s OR id = %s", m[1].id, t[2].id)

    found = problems(chain.verify(conn))

    assert {row_id for _, row_id, _ in found[middle]} == {m[2].id}
    assert any("previous row" in p for _, _, p in found[middle])
    assert any("does not follow" in p for _, _, p in found[middle])  # used_after 3 after 1
    [(_, row_id, problem)] = found[tail]
    assert row_id is None and f"names row {t[2].id}" in problem


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
    [forged, head_finding] = chain.verify(conn).findings
    assert forged.row_id == rows(conn, account)[1].id and "fields do not match" in forged.problem
    assert head_finding.row_id is None and f"names row {first.id}" in head_finding.problem


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
        (accounts[3], True),  # its hash
        (accounts[3], True),  # its numbers
        ("zzz-no-such-account", True),  # its hash
        ("zzz-no-such-account", False),  # no head
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
    assert {f.row_id for f in chain.verify(conn, since=ids[1]).findings} == {ids[1]}
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
    [finding, head_finding] = chain.verify(conn).findings
    assert finding.row_id == got[2].id and "seq 7 where 3 was expected" in finding.problem
    assert head_finding.row_id is None and "its last row is" in head_finding.problem


def test_a_repeated_seq_is_named(conn: Any, plans: Any) -> None:
    account, got = _three_takes(conn, plans)
    conn.execute("DROP INDEX ledger_chain_seq")  # as a superuser could, to write a repeat
    tamper(conn, "UPDATE ledger SET seq = 2 WHERE account_id = %s AND id = %s", account, got[2].id)
    findings = chain.verify(conn).findings
    assert any(f.row_id in (got[1].id, got[2].id) and "seq 2 where 3" in f.problem for f in findings)


def test_rows_moved_in_seq_are_named(conn: Any, plans: Any) -> None:
    """Two rows swapping places: their hashes are intact, their links are not."""
    account, got = _three_takes(conn, plans)
    for seq, row in ((1000, got[1]), (2, got[2]), (3, got[1])):
        tamper(conn, "UPDATE ledger SET seq = %s WHERE account_id = %s AND id = %s", seq, account, row.id)
    findings = chain.verify(conn).findings
    assert any(f.row_id == got[2].id and "previous row" in f.problem for f in findings)


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


# --- rows that follow from the row before, every counter the ledger holds ---------------------------


def rewrite(conn: Any, account_id: str, metric: str, changes: dict[int, dict[str, Any]]) -> None:
    """Rewrite a counter's rows as an owner covering their tracks would: change fields of the rows at
    the given seqs, recompute every hash from there on and move the head, so that every hash, link
    and head holds (only what the fields say can give it away)."""
    new = None
    for r in rows(conn, account_id, metric):
        prev_hash = None if new is None else new.hash
        new = r._replace(**changes.get(r.seq, {}), prev_hash=prev_hash)
        new = new._replace(hash=chain.row_hash(prev_hash, new))
        if new != r:
            tamper(
                conn,
                "UPDATE ledger SET at = %s, period = %s, units = %s, used_after = %s, lim = %s, actor = %s,"
                " prev_hash = %s, hash = %s WHERE account_id = %s AND id = %s",
                new.at,
                new.period,
                new.units,
                new.used_after,
                new.lim,
                new.actor,
                new.prev_hash,
                new.hash,
                account_id,
                r.id,
            )
    assert new is not None
    tamper(
        conn,
        "UPDATE quotas SET chain_id = %s, chain_seq = %s, chain_prev = %s, chain_hash = %s"
        " WHERE account_id = %s AND metric = %s",
        new.id,
        new.seq,
        new.prev_hash,
        new.hash,
        account_id,
        metric,
    )


def _five_kinds(conn: Any, plans: Any) -> tuple[str, list[Any]]:
    """take 3, take 2, release the first, admin reset, take 1: used_after 3, 5, 2, 0, 1."""
    account = new_account(conn, plans)
    set_override(conn, account, METRIC, 10)
    first = takes.take(conn, plans, account_id=account, metric=METRIC, units=3, actor="t")
    takes.take(conn, plans, account_id=account, metric=METRIC, units=2, actor="t")
    takes.release(conn, take_id=first.take_id, actor="t")
    admin.reset_counter(conn, plans, account_id=account, metric=METRIC, actor="ops")
    takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    got = rows(conn, account)
    assert [(r.kind, r.units, r.used_after) for r in got] == [
        ("take", 3, 3),
        ("take", 2, 5),
        ("release", 3, 2),
        ("reset", 2, 0),
        ("take", 1, 1),
    ]
    return account, got


def _at(got: list[Any], seq: int, **delta: float) -> dict[str, Any]:
    return {"at": got[seq - 1].at + timedelta(**delta)}


REWRITES: list[tuple[str, Callable[[list[Any]], dict[int, dict[str, Any]]], list[tuple[int, str]]]] = [
    ("time goes back", lambda g: {3: _at(g, 1, hours=-2)}, [(3, "is before the previous row")]),
    (
        "period goes back",
        lambda g: {3: {"period": EARLIER}},
        [(3, f"period {EARLIER} after the previous"), (4, f"entered from {EARLIER}")],
    ),
    (
        "a later period entered holding usage, without its reset row",
        lambda g: {n: {"period": "2999-01"} for n in (2, 3, 4, 5)},
        [(2, "while the counter held 3 (row")],
    ),
    ("a take's used_after", lambda g: {2: {"used_after": 6}}, [(2, "a take of 2 leaves 5"), (3, "does not")]),
    ("a take's units", lambda g: {2: {"units": 1}}, [(2, "a take of 1 leaves 4")]),
    ("a take over its limit", lambda g: {1: {"lim": 2}}, [(1, "over the limit 2")]),
    ("a release's units", lambda g: {3: {"units": 1}}, [(3, "a release of 1 leaving 2 does not follow")]),
    (
        "a release of more than held",
        lambda g: {3: {"units": 6, "used_after": 0}},
        [(3, "at most what"), (4, "a reset clears 0")],
    ),
    ("a reset's units", lambda g: {4: {"units": 7}}, [(4, "a reset clears 2 and leaves 0")]),
    (
        "a reset that leaves usage",
        lambda g: {4: {"used_after": 1}},
        [(4, "a reset clearing 2 and leaving 1"), (5, "a take of 1 leaves 2")],
    ),
]


@pytest.mark.parametrize(("what", "changes", "expected"), REWRITES, ids=[r[0] for r in REWRITES])
def test_a_consistently_rewritten_row_that_does_not_follow_is_named(
    conn: Any, plans: Any, what: str, changes: Any, expected: list[tuple[int, str]]
) -> None:
    """Every hash, link and head holds after the rewrite: only the rule the row breaks names it."""
    account, got = _five_kinds(conn, plans)
    assert chain.verify(conn).ok
    rewrite(conn, account, METRIC, changes(got))

    result = chain.verify(conn)

    found = [(f.row_id, f.problem) for f in result.findings]
    assert not any("hash" in p or "head" in p for _, p in found), found
    assert len(found) == len(expected), found
    for (row_id, problem), (seq, words) in zip(found, expected, strict=True):
        assert row_id == got[seq - 1].id and words in problem, (what, found)


def test_every_break_of_an_account_is_reported(conn: Any, plans: Any) -> None:
    """Two counters of one account and two rows of one of them: four findings, not the first."""
    account, got = _five_kinds(conn, plans)
    takes.take(conn, plans, account_id=account, metric="seats", actor="t")
    other = rows(conn, account, "seats")[0]
    tamper(
        conn,
        "UPDATE ledger SET actor = 'x' WHERE account_id = %s AND id IN (%s, %s)",
        account,
        got[0].id,
        got[4].id,
    )
    tamper(conn, "UPDATE ledger SET actor = 'x' WHERE account_id = %s AND id = %s", account, other.id)
    seen: list[chain.Finding] = []

    result = chain.verify(conn, on_finding=seen.append)

    assert [(f.metric, f.row_id) for f in result.findings] == [
        ("seats", other.id),
        (METRIC, got[0].id),
        (METRIC, got[4].id),
    ]
    assert seen == result.findings and (result.breaks, result.broken_accounts) == (3, 1)


def allow_any_account_id(conn: Any) -> None:
    """Drop the ledger's rules on account_id in this test's database, as its owner could, so that a
    row of an id the service never writes ('') can be inserted behind the writers' back: a CHECK of
    the table (Citus) or the column's domain (migrations/0021), taken back to plain text."""
    for (name,) in conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'ledger'::regclass AND contype = 'c'"
        " AND pg_get_constraintdef(oid) LIKE '%%account_id%%'"
    ).fetchall():
        conn.execute(sql.SQL("ALTER TABLE ledger DROP CONSTRAINT {}").format(sql.Identifier(name)))
    (column_type,) = conn.execute(
        "SELECT atttypid::regtype::text FROM pg_attribute WHERE attrelid = 'ledger'::regclass"
        " AND attname = 'account_id'"
    ).fetchone()
    if column_type != "text":  # never on Citus, where it is the distribution column
        conn.execute("ALTER TABLE ledger ALTER COLUMN account_id TYPE text")


def forge(conn: Any, account_id: str, metric: str, n: int) -> list[int]:
    """n correctly chained takes of one unit for (account_id, metric), inserted as the owner with the
    triggers off and no head in quotas: a chain no verify of the hashes alone can fault."""
    prev: bytes | None = None
    ids = []
    for seq in range(1, n + 1):
        (row_id, at) = conn.execute("SELECT nextval('ledger_id_seq'), clock_timestamp()").fetchone()
        row = type(
            "Row",
            (),
            {
                "id": row_id,
                "at": at,
                "account_id": account_id,
                "metric": metric,
                "period": PERIOD,
                "kind": "take",
                "units": 1,
                "used_after": seq,
                "lim": None,
                "take_id": None,
                "idempotency_key": None,
                "actor": "forger",
            },
        )
        h = chain.row_hash(prev, row)
        tamper(
            conn,
            "INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, actor,"
            " prev_hash, hash) OVERRIDING SYSTEM VALUE"
            " VALUES (%s, %s, %s, %s, %s, %s, 'take', 1, %s, 'forger', %s, %s)",
            row_id,
            at,
            seq,
            account_id,
            metric,
            PERIOD,
            seq,
            prev,
            h,
        )
        prev = h
        ids.append(row_id)
    return ids


def test_an_empty_account_id_and_a_counter_without_head_are_walked_and_reported(
    conn: Any, plans: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        chain, "PAGE_ACCOUNTS", 1
    )  # '' before the first page's account, bogus on a later page
    accounts = sorted(new_account(conn, plans) for _ in range(2))
    for a in accounts:
        takes.take(conn, plans, account_id=a, metric=METRIC, actor="t")
    allow_any_account_id(conn)
    empty = forge(conn, "", METRIC, 2)
    bogus = forge(conn, accounts[1], "bogus_metric", 3)

    result = chain.verify(conn)

    assert (result.rows, result.counters, result.accounts) == (7, 4, 3)
    assert [(f.account_id, f.metric, f.row_id) for f in result.findings] == [
        ("", METRIC, None),
        (accounts[1], "bogus_metric", None),
    ]
    assert (
        f"2 row(s) of this counter (last row {empty[1]}, seq 2) but it has no head"
        in result.findings[0].problem
    )
    assert f"3 row(s) of this counter (last row {bogus[2]}, seq 3)" in result.findings[1].problem
    assert result.findings[0].describe().startswith("account '' urls head: ")

    one = chain.verify(conn, account_id="")
    assert (one.rows, one.breaks) == (2, 1)
    assert chain.verify(conn, account_id=accounts[0]).ok
    since = chain.verify(conn, since=min(empty))  # the rows since, and the head-less counters among them
    assert {(f.account_id, f.metric) for f in since.findings} == {("", METRIC), (accounts[1], "bogus_metric")}


def test_the_verify_command_reports_an_empty_account_id(conn: Any, db_url: str, plans: Any) -> None:
    from tests.db.test_finance_commands import cli

    account = new_account(conn, plans)
    takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    assert cli(db_url, "ledger", "verify", "--account", "").returncode == 0  # nothing there yet
    allow_any_account_id(conn)
    forge(conn, "", METRIC, 1)

    out = cli(db_url, "ledger", "verify", "--account", "")

    assert out.returncode == 1, out.stderr
    assert "ledger verify: 1 rows checked in 1 counters of 1 accounts" in out.stdout
    assert "account '' urls head: the ledger holds 1 row(s)" in out.stdout
    assert cli(db_url, "ledger", "verify").returncode == 1
    assert cli(db_url, "ledger", "verify", "--account", account).returncode == 0

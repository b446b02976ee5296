"""The cross-account jobs on the cluster, where a batch that got its shards wrong would fail or
chain wrongly: the monthly reset runs once per counter and period under concurrent runners and
takes, leaves counters equal to the ledger and every chain verifiable, with one coordinator-drawn
ledger id per reset row; the plan sync's dry run reads every shard's accounts. (The suite's own
reset tests run here too: tests/citus/__init__.py.)"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from service.errors import QuotaExhausted
from service.plans import parse_plans
from service.quota import chain, ledger, reset
from service.quota.plan_sync import LimitChange, sync_plans
from service.quota.takes import take
from tests.citus import on_cluster
from tests.conftest import connect as connect_db
from tests.workers.conftest import AT, P1, seed

pytestmark = pytest.mark.skipif(
    not on_cluster(), reason="runs on the Citus cluster only (QUOTA_TEST_CITUS=1 pytest -m citus; .ci/run)"
)


def test_two_runners_and_takes_reset_each_counter_once(conn: Any, db_url: str, plans: Any) -> None:
    before = seed(conn, plans, accounts=24)
    shards = conn.execute("SELECT count(DISTINCT account_shard(account_id)) FROM quotas").fetchone()[0]
    assert shards > 1
    barrier = threading.Barrier(3)
    outcomes: list[reset.ResetOutcome] = []
    errors: list[BaseException] = []
    taken: list[tuple[str, str]] = []

    def runner() -> None:
        try:
            with connect_db(db_url) as c:
                barrier.wait()
                while True:  # a runner that found the lock busy comes back, as the hourly tick would
                    outcome = reset.reset_month(c, at=AT, batch_size=2, duty=1)
                    outcomes.append(outcome)
                    if outcome.status != "lock_busy":
                        return
        except BaseException as e:
            errors.append(e)

    def taker() -> None:
        """Takes in the new month on counters the runners may not have reached: lazy rollovers."""
        rnd = random.Random(7)
        try:
            with connect_db(db_url) as c:
                barrier.wait()
                for account_id, metric in rnd.sample(sorted(before), 30):
                    try:
                        take(c, plans, account_id=account_id, metric=metric, actor="t", period=P1)
                        taken.append((account_id, metric))
                    except QuotaExhausted:
                        pass
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (runner, runner, taker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    assert {o.status for o in outcomes} <= {"done", "already_done", "lock_busy"}
    run = reset.reset_status(conn, period=P1)
    assert run is not None and run["status"] == "done"
    assert run["batches"] >= shards  # a batch never spans shards

    # Once per counter: one period opening each (by the job or a take's rollover) that cleared
    # what the counter held, none twice; every counter in the new month, at 0 unless taken from.
    opened = conn.execute(
        "SELECT account_id, metric, count(*), sum(units) FROM ledger"
        " WHERE kind = 'reset' AND idempotency_key = %s GROUP BY 1, 2",
        (f"period-open:{P1}",),
    ).fetchall()
    assert {(a, m): (n, cleared) for a, m, n, cleared in opened} == {
        k: (1, used) for k, used in before.items() if used
    }
    rows = conn.execute("SELECT account_id, metric, period, used FROM quotas").fetchall()
    state = {(a, m): (p, u) for a, m, p, u in rows}  # the monthly metrics' (seed's), and the others'
    assert {k: state[k][0] for k in before} == {k: P1 for k in before}
    assert all(state[k][1] == 0 for k in before if k not in taken)
    # Counters = ledger, as finance checks it, and every chain verifies.
    assert ledger.reconcile(conn, period=P1).ok
    verified = chain.verify(conn)
    assert verified.ok, verified.findings
    # Every row has its own ledger id (the reset rows' drawn on the coordinator, the takes' on the
    # account's worker, from its own range): ids are only unique, the chains follow seq.
    n, distinct = conn.execute("SELECT count(*), count(DISTINCT id) FROM ledger").fetchone()
    assert n == distinct


def test_plan_sync_dry_run_reads_every_shard(conn: Any, plans: Any) -> None:
    """The dry run locks nothing, so it runs on the cluster already; its batches are the apply's."""
    accounts = seed(conn, plans, accounts=12)
    counters = set(conn.execute("SELECT account_id, metric FROM quotas").fetchall())  # every kind's
    richer = parse_plans(
        {
            "free_plan": "free",
            "plans": {"free": {"limits": {m: 999 for m in plans.metrics}}},
        }
    )
    before = conn.execute("SELECT * FROM quotas ORDER BY account_id, metric").fetchall()
    seen: list[LimitChange] = []
    outcome = sync_plans(conn, richer, dry_run=True, batch_size=5, on_change=seen.append)
    assert outcome.status == "done" and outcome.accounts == len({a for a, _ in accounts})
    assert {(c.account_id, c.metric) for c in seen} == counters
    assert conn.execute("SELECT * FROM quotas ORDER BY account_id, metric").fetchall() == before


def test_plan_sync_applies_by_shard(conn: Any, plans: Any) -> None:
    """The sync's own statements lock one shard's accounts per batch; its apply step changes limits
    through quota_set_plan_limits_batch, with an audit row each, overrides left alone."""
    seed(conn, plans, accounts=12)
    accounts = conn.execute("SELECT account_id, metric FROM quotas").fetchall()  # every kind's counters
    conn.execute("UPDATE quotas SET override_set = true, override_limit = 7 WHERE account_id = 'acc0001'")
    richer = parse_plans(
        {
            "free_plan": "free",
            "plans": {"free": {"limits": {m: 999 for m in plans.metrics}}},
        }
    )
    outcome = sync_plans(conn, richer, batch_size=5)
    assert outcome.status == "done" and outcome.changes == len(accounts)
    assert conn.execute("SELECT count(*) FROM quotas WHERE plan_limit = 999 AND free_limit = 999").fetchone()[
        0
    ] == len(accounts)
    assert conn.execute(
        "SELECT override_limit FROM quotas WHERE account_id = 'acc0001' AND override_set"
    ).fetchall() == [(7,)] * len(plans.metrics)
    audited = conn.execute("SELECT count(*) FROM audit_log WHERE action = 'plan_limit_changed'")
    assert audited.fetchone()[0] >= len(accounts)
    assert sync_plans(conn, richer).changes == 0

"""Plan sync: stored plan limits follow the config; overrides, usage and the ledger never move;
sync twice = sync once; the dry run writes nothing and announces exactly what the sync then does."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.errors import QuotaExhausted
from service.plans import PlanConfig, parse_plans
from service.quota import overrides
from service.quota.accounts import upsert_account
from service.quota.plan_sync import LimitChange, sync_plans
from service.quota.takes import take
from tests.db.helpers import set_plan
from tests.workers.conftest import ROOT, counter_mismatches

METRICS = ("urls", "seats", "api_calls", "exports")
PLAN_NAMES = ("free", "basic", "pro")
STATUSES = ("none", "trialing", "active", "past_due", "unpaid", "canceled", "expired", "paused")
UNSET = "unset"

limit_values = st.one_of(st.integers(0, 1000), st.just("unlimited"))
plan_limits = st.dictionaries(st.sampled_from(METRICS), limit_values, min_size=1, max_size=len(METRICS))
configs = st.fixed_dictionaries({name: plan_limits for name in PLAN_NAMES}).map(
    lambda limits: parse_plans(
        {"free_plan": "free", "plans": {name: {"limits": lim} for name, lim in limits.items()}}
    )
)
accounts_st = st.lists(
    st.fixed_dictionaries(
        {
            "plan": st.sampled_from((*PLAN_NAMES, "legacy")),  # "legacy": a plan the config dropped
            "status": st.sampled_from(STATUSES),
            "overrides": st.dictionaries(
                st.sampled_from(METRICS), st.one_of(st.none(), st.integers(0, 50)), max_size=2
            ),
            "used": st.integers(0, 3),
            "deleted": st.booleans(),
        }
    ),
    min_size=1,
    max_size=5,
)


def snapshot(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    return {
        "quotas": conn.execute("SELECT * FROM quotas ORDER BY account_id, metric").fetchall(),
        "accounts": conn.execute(
            "SELECT id, plan, subscription_status, deleted FROM accounts ORDER BY id"
        ).fetchall(),
        "audit": conn.execute("SELECT count(*) FROM audit_log").fetchone(),
        "ledger": conn.execute("SELECT count(*) FROM ledger").fetchone(),
    }


def override_columns(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        (a, m): (s, v)
        for a, m, s, v in conn.execute(
            "SELECT account_id, metric, override_set, override_limit FROM quotas"
        ).fetchall()
    }


def test_plan_sync_property(conn: psycopg.Connection[Any]) -> None:
    example = itertools.count()

    @settings(
        max_examples=int(os.environ.get("PLAN_SYNC_EXAMPLES", "40")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(before=configs, after=configs, accounts=accounts_st)
    def check(before: PlanConfig, after: PlanConfig, accounts: list[dict[str, Any]]) -> None:
        n = next(example)
        live: dict[str, dict[str, Any]] = {}
        for i, spec in enumerate(accounts):
            account_id = f"ex{n}-{i}"
            upsert_account(conn, before, account_id=account_id, kind="user")
            set_plan(
                conn, before, account_id=account_id, plan=spec["plan"], status=spec["status"], actor="test"
            )
            for metric, limit in spec["overrides"].items():
                if metric in before.metrics:
                    overrides.set_override(
                        conn, before, account_id=account_id, metric=metric, limit=limit, actor="test"
                    )
            if spec["used"]:
                with contextlib.suppress(QuotaExhausted):
                    take(
                        conn,
                        before,
                        account_id=account_id,
                        metric=before.metrics[0],
                        units=spec["used"],
                        actor="test",
                    )
            if spec["deleted"]:
                conn.execute("UPDATE accounts SET deleted = true WHERE id = %s", (account_id,))
                conn.execute("UPDATE quotas SET account_deleted = true WHERE account_id = %s", (account_id,))
            else:
                live[account_id] = spec

        start = snapshot(conn)
        announced: list[LimitChange] = []
        dry = sync_plans(conn, after, dry_run=True, on_change=announced.append, batch_size=3)
        assert snapshot(conn) == start, "the dry run wrote something"
        assert dry.status == "done"

        made: list[LimitChange] = []
        real = sync_plans(conn, after, on_change=made.append, batch_size=3)
        assert [c.describe() for c in made] == [c.describe() for c in announced]
        assert (real.changes, real.created) == (dry.changes, dry.created)

        # override columns are byte-identical on every counter that existed
        old_overrides = {(r[0], r[1]): (r[4], r[5]) for r in start["quotas"]}
        now_overrides = override_columns(conn)
        assert {k: now_overrides[k] for k in old_overrides} == old_overrides
        # one audit row per changed limit; usage and the ledger untouched
        end = snapshot(conn)
        assert end["audit"][0] - start["audit"][0] == real.changes
        assert end["ledger"] == start["ledger"]
        old_usage = {(r[0], r[1]): (r[8], r[9]) for r in start["quotas"]}
        assert {(r[0], r[1]): (r[8], r[9]) for r in end["quotas"] if (r[0], r[1]) in old_usage} == old_usage
        # every live account's stored limits are now what the config says
        rows = {
            (a, m): (p, f, lapsed)
            for a, m, p, f, lapsed in conn.execute(
                "SELECT account_id, metric, plan_limit, free_limit, lapsed FROM quotas "
                "WHERE NOT account_deleted"
            ).fetchall()
        }
        for account_id, spec in live.items():
            for metric in after.metrics:
                assert rows[(account_id, metric)] == (
                    after.limit(spec["plan"], metric),
                    after.limit(after.free_plan, metric),
                    spec["plan"] != after.free_plan
                    and spec["status"] not in {"active", "trialing", "past_due"},
                ), (account_id, metric)
        # deleted accounts are skipped
        for a, m, *_ in start["quotas"]:
            if a.startswith(f"ex{n}-") and a not in live:
                assert [r for r in end["quotas"] if (r[0], r[1]) == (a, m)] == [
                    r for r in start["quotas"] if (r[0], r[1]) == (a, m)
                ]

        # sync . sync = sync
        second = sync_plans(conn, after)
        assert (second.changes, second.created) == (0, 0)
        assert snapshot(conn) == end

    check()
    assert counter_mismatches(conn) == []


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


PLANS_V1 = """
free_plan = "free"
[plans.free]
limits = { urls = 50, seats = 1 }
[plans.pro]
limits = { urls = 500, seats = 5 }
stripe_prices = ["pro_monthly"]
"""
PLANS_V2 = PLANS_V1.replace("urls = 500", "urls = 800").replace("seats = 1 }", "seats = 1, exports = 3 }")


def test_sync_plans_command(conn: psycopg.Connection[Any], app_db_url: str, tmp_path: Path) -> None:
    v1 = parse_plans(tomllib.loads(PLANS_V1))
    for account_id in ("alice", "bob"):
        upsert_account(conn, v1, account_id=account_id, kind="user")
        set_plan(conn, v1, account_id=account_id, plan="pro", status="active", actor="test")
    overrides.set_override(conn, v1, account_id="bob", metric="urls", limit=10_000, actor="admin")

    def cli(plans_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DATABASE_URL": app_db_url, "PLANS_FILE": str(plans_file)}
        return subprocess.run(
            [sys.executable, "-m", "service.cli", "sync-plans", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    start = snapshot(conn)
    v2 = _write(tmp_path / "v2.toml", PLANS_V2)
    dry = cli(v2, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert snapshot(conn) == start
    lines = dry.stdout.splitlines()
    assert "alice urls: plan_limit 500 -> 800" in lines
    assert "bob urls: plan_limit 500 -> 800 (override 10000 left alone, still in effect)" in lines
    assert "alice exports: new counter, plan_limit 0, free_limit 3, lapsed false" in lines
    assert lines[-1].startswith("plan sync (dry run, nothing written): 2 accounts checked, would change 2")
    assert "1 overrides left alone" in lines[-1]
    verbose = cli(v2, "--dry-run", "-v")  # progress on stderr, and still each line once
    assert verbose.returncode == 0, verbose.stderr
    everything = verbose.stdout + verbose.stderr
    # the summary ends with the run's own duration, which may differ between the two runs
    same = [re.sub(r", [0-9.]+ s$", "", line) for line in lines]
    assert all(everything.count(line) == 1 for line in same), everything

    broken = _write(tmp_path / "broken.toml", PLANS_V2.replace("urls = 800", "urls = -1"))
    refused = cli(broken)
    assert refused.returncode == 2
    assert "refused, nothing changed" in refused.stderr and "plans.pro.limits.urls" in refused.stderr
    assert snapshot(conn) == start
    # a Stripe price that is both a plan's and a credit pack's: refused, naming it (README "Credits")
    both = PLANS_V2 + '[credit_packs.p]\nmetric = "urls"\nunits = 5\nstripe_prices = ["pro_monthly"]\n'
    refused = cli(_write(tmp_path / "both.toml", both))
    assert refused.returncode == 2 and "'pro_monthly'" in refused.stderr, refused.stderr
    assert snapshot(conn) == start

    did = cli(v2)
    assert did.returncode == 0, did.stderr
    assert did.stdout.splitlines()[:-1] == lines[:-1]
    assert "changed 2 limits, created 2 counters, 1 overrides left alone" in did.stdout
    assert conn.execute(
        "SELECT plan_limit, override_set, override_limit FROM quotas"
        " WHERE account_id = 'bob' AND metric = 'urls'"
    ).fetchone() == (800, True, 10_000)
    audit = conn.execute(
        "SELECT actor, action, old, new FROM audit_log WHERE account_id = 'alice' AND metric = 'urls' "
        "AND action = 'plan_limit_changed' ORDER BY id DESC LIMIT 1"
    ).fetchone()
    assert audit is not None and audit[0] == "system:plan_sync"
    assert (audit[2]["plan_limit"], audit[3]["plan_limit"]) == (500, 800)

    again = cli(v2)
    assert again.returncode == 0 and "changed 0 limits, created 0 counters" in again.stdout

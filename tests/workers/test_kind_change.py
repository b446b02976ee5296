"""A metric whose kind changes in the plan config while counters hold usage counted the old way:
`sync-plans` refuses (exit 2, nothing written) and takes are refused, until `convert-metric` closes
those counters; usage is never lost (the ledger keeps it) nor doubled (the counter starts from 0)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import psycopg
import pytest

from service.errors import MetricKindChanged
from service.plans import parse_plans
from service.quota import chain, ledger, periods
from service.quota.accounts import upsert_account
from service.quota.takes import take
from tests.workers.conftest import ROOT

MONTHLY = """
free_plan = "free"
[plans.free]
limits = { urls = 5, seats = 3 }
"""
DAILY = (
    MONTHLY
    + """
[metrics]
urls = { reset = "day" }
seats = { kind = "allocation" }
"""
)


def _cli(app_db_url: str, plans_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": app_db_url, "PLANS_FILE": str(plans_file)}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _state(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return (
        conn.execute(
            "SELECT account_id, metric, period, used, plan_limit FROM quotas ORDER BY 1, 2"
        ).fetchall()
        + conn.execute("SELECT id, kind, period FROM ledger ORDER BY id").fetchall()
    )


def test_a_kind_change_is_refused_until_the_counters_are_converted(
    conn: psycopg.Connection[Any], app_db_url: str, tmp_path: Path
) -> None:
    monthly = parse_plans(tomllib.loads(MONTHLY))
    daily = parse_plans(tomllib.loads(DAILY))
    upsert_account(conn, monthly, account_id="alice", kind="user")
    upsert_account(conn, monthly, account_id="bob", kind="user")
    take(conn, monthly, account_id="alice", metric="urls", units=2, actor="t")
    take(conn, monthly, account_id="alice", metric="seats", units=1, actor="t")
    new_file = tmp_path / "plans.toml"
    new_file.write_text(DAILY)
    before = _state(conn)

    with pytest.raises(MetricKindChanged):
        take(conn, daily, account_id="alice", metric="urls", actor="t")
    refused = _cli(app_db_url, new_file, "sync-plans")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "refused, nothing changed" in refused.stderr
    assert "urls: 1 counters hold 2 units" in refused.stderr and "convert-metric urls" in refused.stderr
    assert "seats: 1 counters hold 1 units" in refused.stderr
    assert _state(conn) == before

    for metric in ("urls", "seats"):
        done = _cli(app_db_url, new_file, "convert-metric", metric)
        assert done.returncode == 0, done.stderr
        assert f"convert-metric {metric}: 2 counters now counted as" in done.stdout

    assert _cli(app_db_url, new_file, "sync-plans").returncode == 0
    today = periods.day_of(periods.now())
    assert take(conn, daily, account_id="alice", metric="urls", actor="t").period == today
    rows = conn.execute(
        "SELECT metric, kind, period, units, actor FROM ledger WHERE account_id = 'alice' AND kind = 'reset'"
        " ORDER BY metric"
    ).fetchall()
    assert rows == [
        ("seats", "reset", periods.HELD, 1, "system:convert_metric"),
        ("urls", "reset", today, 2, "system:convert_metric"),
    ]
    # the usage counted monthly stays in the month's ledger, and the chains still verify
    assert ledger.reconcile(conn, period=periods.current_period()).ok
    assert chain.verify(conn).ok

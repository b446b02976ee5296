"""The inbox's retention: unmatched events bounded per provider (the oldest go, counted and logged),
ignored ones purged after their days, applied ones kept for ever unless finance sets days, failed
ones kept; `quota-ledger inbox stats` shows what is kept and what went."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.billing import delivery, inbox
from service.cli import main
from service.config import Settings
from service.plans import PlanConfig
from service.webhooks import PROVIDERS, stripe
from tests.conftest import STRIPE_SECRET
from tests.db.helpers import new_account
from tests.webhooks.helpers import body_of, now, sign, stripe_subscription_event


def _receive(conn: Any, plans: PlanConfig, event: dict[str, Any], **kw: Any) -> delivery.Receipt:
    body = body_of(event)
    env = stripe.verify(body, sign(body), [STRIPE_SECRET])
    kw.setdefault("translate", stripe.translate)
    return delivery.receive(conn, plans, env, allowed=True, **kw)


def _unmatched(n: int) -> dict[str, Any]:
    return stripe_subscription_event(
        event_id=f"evt_flood_{n}",
        created=now() - 100 + n,
        sub_id=f"sub_flood_{n}",
        customer=f"cus_flood_{n}",
        account_id=f"acc_nobody_{n}",
    )


def _kept(conn: Any, status: str) -> list[str]:
    rows = conn.execute(
        "SELECT event_id FROM webhook_events WHERE status = %s ORDER BY id", (status,)
    ).fetchall()
    return [r[0] for r in rows]


def _removed(conn: Any) -> dict[tuple[str, str, str], int]:
    rows = conn.execute("SELECT provider, status, reason, events FROM webhook_events_purged").fetchall()
    return {(p, s, r): n for p, s, r, n in rows}


def test_a_flood_of_unmatched_events_keeps_the_newest_and_counts_and_logs_the_rest(conn, plans, caplog):
    with caplog.at_level(logging.WARNING, logger="service.billing.inbox"):
        for n in range(5):
            assert _receive(conn, plans, _unmatched(n), unmatched_limit=3).status == "unmatched"
    assert _kept(conn, "unmatched") == ["evt_flood_2", "evt_flood_3", "evt_flood_4"]
    assert _removed(conn) == {("stripe", "unmatched", "over_bound"): 2}
    # the ids of what went are in the log: a provider resends an event by its id
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "evt_flood_0" in logged and "evt_flood_1" in logged


def test_without_a_bound_every_unmatched_event_is_kept(conn, plans):
    """What the bound is about: the same flood, no bound, nothing goes."""
    for n in range(5):
        _receive(conn, plans, _unmatched(n))
    assert len(_kept(conn, "unmatched")) == 5
    assert _removed(conn) == {}


def test_the_purge_removes_old_ignored_events_and_keeps_what_matters(conn, plans):
    account = new_account(conn, plans, "acc_retention")
    t = now() - 1000
    applied = stripe_subscription_event(event_id="evt_applied", created=t, account_id=account, sub_id="sub_r")
    stale = stripe_subscription_event(
        event_id="evt_stale", created=t - 10, account_id=account, sub_id="sub_r"
    )
    assert _receive(conn, plans, applied).status == "applied"
    assert _receive(conn, plans, stale).status == "ignored"  # older than the stored state
    _receive(conn, plans, _unmatched(0))
    broken = stripe_subscription_event(event_id="evt_broken", created=t, account_id=account, sub_id="sub_b")

    def unreadable(_env: Any) -> Any:
        raise ValueError("cannot read it")

    assert _receive(conn, plans, broken, translate=unreadable).status == "failed"
    at = datetime.now(UTC)
    # received 40 days ago (a value: Citus takes no STABLE function of a column in an UPDATE)
    conn.execute("UPDATE webhook_events SET received_at = %s", (at - timedelta(days=40),))
    keep_applied = inbox.Retention(applied_days=0, ignored_days=30, unmatched_limit=10)
    outcome = inbox.purge(conn, keep_applied, providers=PROVIDERS, at=at)
    assert (outcome.ignored, outcome.applied, outcome.over_bound) == (1, 0, 0)
    assert _kept(conn, "ignored") == []
    assert _kept(conn, "applied") == ["evt_applied"]  # for ever, by default
    assert _kept(conn, "unmatched") == ["evt_flood_0"] and _kept(conn, "failed") == ["evt_broken"]
    # run again: nothing more to do
    assert inbox.purge(conn, keep_applied, providers=PROVIDERS, at=at).ignored == 0

    # finance lets applied events go after 35 days; younger ones stay
    def applied_gone(days: int) -> int:
        retention = inbox.Retention(applied_days=days, ignored_days=30, unmatched_limit=10)
        return inbox.purge(conn, retention, providers=PROVIDERS, at=at).applied

    assert applied_gone(45) == 0
    assert applied_gone(35) == 1
    assert _kept(conn, "applied") == []
    assert _removed(conn) == {
        ("stripe", "ignored", "retention"): 1,
        ("stripe", "applied", "retention"): 1,
    }
    # a lowered bound: the purge applies it too
    _receive(conn, plans, _unmatched(1))
    lowered = inbox.Retention(applied_days=0, ignored_days=30, unmatched_limit=1)
    assert inbox.purge(conn, lowered, providers=PROVIDERS, at=at).over_bound == 1
    assert _kept(conn, "unmatched") == ["evt_flood_1"]


def test_inbox_stats_shows_what_is_kept_and_what_went(conn, plans, capsys, monkeypatch, db_url):
    for n in range(3):
        _receive(conn, plans, _unmatched(n), unmatched_limit=2)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("INBOX_UNMATCHED_LIMIT", "2")
    assert main(["inbox", "stats"]) == 0
    out = capsys.readouterr().out
    assert "unmatched at most 2 per provider" in out and "applied for ever" in out
    assert any(line.split()[:3] == ["stripe", "unmatched", "2"] for line in out.splitlines()), out
    assert "removed: stripe unmatched (over_bound): 1" in out


@pytest.mark.parametrize("value", ["0", "-1", "ten"])
def test_an_unmatched_limit_below_one_is_refused(value):
    with pytest.raises(RuntimeError, match="INBOX_UNMATCHED_LIMIT"):
        Settings.from_env({"DATABASE_URL": "postgresql://x", "INBOX_UNMATCHED_LIMIT": value})

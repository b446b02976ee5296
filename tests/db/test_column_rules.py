"""The database refuses values outside each column's rule (migrations/0005.domains.sql moved them
from table CHECK constraints to domains), whoever writes them, and changes nothing when it does.
Also: the migration keeps the data and the indexes of a populated database, without a rewrite."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from yoyo import get_backend, read_migrations

from service.migrate import MIGRATIONS_DIR, yoyo_url

SEED = """
INSERT INTO accounts (id, kind, plan) VALUES ('acct-1', 'user', 'pro');
INSERT INTO quotas (account_id, metric, plan_limit, period) VALUES ('acct-1', 'links', 500, '2026-11');
INSERT INTO subscriptions (provider, subscription_id, account_id, plan, status, event_at, event_id)
VALUES ('stripe', 'sub_1', 'acct-1', 'pro', 'active', now(), 'evt_1');
INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, payload)
VALUES ('stripe', 'evt_1', 'customer.subscription.created', now(), 'applied', '{}');
INSERT INTO customer_links (provider, customer_id, account_id, event_id)
VALUES ('stripe', 'cus_1', 'acct-1', 'evt_1');
"""

# Each statement breaks one rule and nothing else.
REFUSED = {
    "account id pattern": "INSERT INTO accounts (id, kind, plan) VALUES ('has space', 'user', 'free')",
    "account id too long": "INSERT INTO accounts (id, kind, plan) VALUES (repeat('a', 129), 'user', 'free')",
    "account kind": "INSERT INTO accounts (id, kind, plan) VALUES ('acct-2', 'robot', 'free')",
    "account status": "UPDATE accounts SET subscription_status = 'bogus' WHERE id = 'acct-1'",
    "quota used below zero": "UPDATE quotas SET used = -1 WHERE account_id = 'acct-1'",
    "quota period": "UPDATE quotas SET period = '2026-13' WHERE account_id = 'acct-1'",
    "plan limit below zero": "UPDATE quotas SET plan_limit = -1 WHERE account_id = 'acct-1'",
    "free limit below zero": "UPDATE quotas SET free_limit = -1 WHERE account_id = 'acct-1'",
    "override limit below zero": (
        "UPDATE quotas SET override_set = true, override_limit = -1 WHERE account_id = 'acct-1'"
    ),
    "a new counter's limit below zero": (
        "INSERT INTO quotas (account_id, metric, plan_limit, period)"
        " VALUES ('acct-1', 'seats', -5, '2026-11')"
    ),
    "override without its flag": "UPDATE quotas SET override_limit = 5 WHERE account_id = 'acct-1'",
    "subscription status 'none'": "UPDATE subscriptions SET status = 'none' WHERE subscription_id = 'sub_1'",
    "subscription provider": "UPDATE subscriptions SET provider = 'paypal' WHERE subscription_id = 'sub_1'",
    "inbox status": "UPDATE webhook_events SET status = 'duplicate' WHERE event_id = 'evt_1'",
    "inbox empty event id": (
        "INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, payload)"
        " VALUES ('stripe', '', 'x', now(), 'ignored', '{}')"
    ),
    "inbox long type": (
        "INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, payload)"
        " VALUES ('stripe', 'evt_2', repeat('x', 256), now(), 'ignored', '{}')"
    ),
    "customer link provider": "UPDATE customer_links SET provider = 'paddle' WHERE customer_id = 'cus_1'",
}

STATE = """
SELECT (SELECT array_agg(a ORDER BY id) FROM accounts a)::text,
       (SELECT array_agg(q ORDER BY account_id, metric) FROM quotas q)::text,
       -- the columns as of 0005: later migrations add some (0008: expires_at), which is no change
       (SELECT array_agg((s.provider, s.subscription_id, s.account_id, s.prior_account_id, s.plan,
                          s.status, s.final, s.event_at, s.event_id, s.updated_at)
                         ORDER BY subscription_id) FROM subscriptions s)::text,
       (SELECT array_agg((w.id, w.provider, w.event_id, w.type, w.status) ORDER BY id)
          FROM webhook_events w)::text,
       (SELECT array_agg(l ORDER BY customer_id) FROM customer_links l)::text
"""


@pytest.fixture
def seeded(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(SEED)
    return conn


@pytest.mark.parametrize("rule", sorted(REFUSED))
def test_a_value_outside_its_rule_is_refused_and_changes_nothing(
    seeded: psycopg.Connection[Any], rule: str
) -> None:
    before = seeded.execute(STATE).fetchone()
    with pytest.raises(psycopg.errors.CheckViolation):
        seeded.execute(REFUSED[rule])
    assert seeded.execute(STATE).fetchone() == before


def test_values_inside_the_rules_are_stored(seeded: psycopg.Connection[Any]) -> None:
    seeded.execute("UPDATE accounts SET subscription_status = 'past_due' WHERE id = 'acct-1'")
    seeded.execute("UPDATE quotas SET used = 0, period = '2026-12' WHERE account_id = 'acct-1'")
    seeded.execute("UPDATE subscriptions SET status = 'expired', provider = 'revenuecat'")
    seeded.execute("UPDATE webhook_events SET status = 'unmatched', type = repeat('x', 255)")
    row = seeded.execute(
        "SELECT a.subscription_status, q.period, q.used, s.status, w.status"
        "  FROM accounts a, quotas q, subscriptions s, webhook_events w"
    ).fetchone()
    assert row == ("past_due", "2026-12", 0, "expired", "unmatched")


def test_the_domain_migration_keeps_a_populated_database_in_place(empty_db: str) -> None:
    backend = get_backend(yoyo_url(empty_db))
    try:
        every = read_migrations(str(MIGRATIONS_DIR))
        before_domains = every.__class__([m for m in every if m.id < "0005"], every.post_apply)
        backend.apply_migrations(backend.to_apply(before_domains))
    finally:
        backend.connection.close()
    files = (
        "SELECT relname, relfilenode FROM pg_class WHERE relname IN ('accounts', 'accounts_pkey', 'quotas',"
        " 'subscriptions', 'webhook_events', 'webhook_events_provider_event_id_key') ORDER BY 1"
    )
    with psycopg.connect(empty_db, autocommit=True) as c:
        c.execute(SEED)
        state, on_disk = c.execute(STATE).fetchone(), c.execute(files).fetchall()

    # Only 0005: later migrations may add columns, which would change the rows' text below.
    backend = get_backend(yoyo_url(empty_db))
    try:
        domains = backend.to_apply(every.__class__([m for m in every if m.id < "0006"], every.post_apply))
        assert [m.id for m in domains] == ["0005.domains"]
        backend.apply_migrations(domains)
    finally:
        backend.connection.close()

    with psycopg.connect(empty_db, autocommit=True) as c:
        assert c.execute(STATE).fetchone() == state
        assert c.execute(files).fetchall() == on_disk  # no table or index was rewritten
        with pytest.raises(psycopg.errors.CheckViolation):
            c.execute(REFUSED["subscription status 'none'"])

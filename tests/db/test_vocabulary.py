"""The Python vocabulary (service/vocabulary.py) and the database's hold the same words: every word
list and pattern in a CHECK constraint or domain of the migrated schema is compared with the enum or
constant that the code uses for it, and a word list the code does not know fails the test, so that
neither side can gain a word the other refuses."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from service import vocabulary as v
from service.quota import periods

# Where the database holds a word list: a domain, or a table's column ("table.column").
WORD_LISTS: dict[str, type[StrEnum] | frozenset[str]] = {
    "account_kind": v.AccountKind,
    "account_billing_status": v.SubscriptionStatus,
    "provider_subscription_status": v.PROVIDER_STATUSES,
    "billing_provider": v.Provider,
    "inbox_status": v.InboxStatus,
    "api_keys.role": v.Role,
    "ledger.kind": v.LedgerKind,  # on Citus; one PostgreSQL has the domain (migrations/0021)
    "ledger_kind": v.LedgerKind,
    "webhook_events_purged.reason": v.PurgeReason,
    "grants.source": v.GrantSource,
    "event_outbox.type": v.EventType,
    "webhook_deliveries.status": v.DeliveryStatus,
}
# Word lists of the database's own, which no code outside SQL names.
SQL_ONLY = {"job_runs.status"}  # the monthly reset's run bookkeeping (running, done)
PATTERNS = {
    "account_key": v.ACCOUNT_ID_PATTERN,
    "accounts.id": v.ACCOUNT_ID_PATTERN,  # on Citus, where accounts.id leaves the domain
    "quota_period": periods.MONTH_OR_DAY_RE.pattern,  # or HELD (checked below)
    "job_runs.period": periods.MONTH_OR_DAY_RE.pattern,
    "api_keys.name": r"^[A-Za-z0-9._:@-]{1,64}$",  # a key's name: the database's rule alone
    # a feature's name: the plan config's, 1 to 64 characters as the schema's Feature field says
    "account_features.feature": r"^.{1,64}$",
}

CHECKS = """
SELECT coalesce(t.typname, c.conrelid::regclass::text || '.' || a.attname) AS name,
       pg_get_constraintdef(c.oid) AS definition
FROM pg_constraint c
LEFT JOIN pg_type t ON t.oid = c.contypid
LEFT JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
WHERE c.contype = 'c' AND c.connamespace = 'public'::regnamespace
  AND (c.contypid <> 0 OR cardinality(c.conkey) = 1)
"""


def _checks(conn: Any) -> tuple[dict[str, set[str]], dict[str, str]]:
    """The database's word lists (`x IN (...)`) and patterns (`x ~ '...'`), by domain or column. A
    pattern `^[...]+$` with a bound on the value's length (`octet_length(x) <= n`, the cheaper form of
    migrations/0021) reads as `^[...]{1,n}$`: the same rule over ASCII classes."""
    words: dict[str, set[str]] = {}
    patterns: dict[str, str] = {}
    for name, definition in conn.execute(CHECKS).fetchall():
        if "= ANY (ARRAY[" in definition:
            words[name] = set(re.findall(r"'([^']*)'::text", definition))
        elif match := re.search(r" ~ '(.*?)'::text", definition):
            pattern = match[1]
            if (bound := re.search(r"octet_length\(.*\) <= (\d+)\)", definition)) and pattern.endswith("]+$"):
                pattern = pattern[: -len("+$")] + f"{{1,{bound[1]}}}$"
            patterns[name] = pattern
    return words, patterns


def test_every_word_list_of_the_database_is_the_codes(conn: Any) -> None:
    words, _ = _checks(conn)
    assert set(words) - SQL_ONLY <= set(WORD_LISTS), "a word list in SQL that no enum holds"
    for name, expected in WORD_LISTS.items():
        if name in words:
            assert words[name] == {str(w) for w in expected}, name
    # each list is held by the database somewhere (a domain here, a column on Citus)
    assert {"account_kind", "account_billing_status", "inbox_status", "api_keys.role"} <= set(words)
    assert {"ledger.kind", "ledger_kind"} & set(words)


def test_every_pattern_of_the_database_is_the_codes(conn: Any) -> None:
    _, patterns = _checks(conn)
    assert set(patterns) <= set(PATTERNS), "a pattern in SQL that no constant holds"
    for name, pattern in patterns.items():
        assert pattern == PATTERNS[name], name
    assert "account_key" in patterns or "accounts.id" in patterns
    held = [d for n, d in conn.execute(CHECKS).fetchall() if n == "quota_period"]
    assert all(f"(VALUE = '{periods.HELD}'::text)" in d for d in held), held


def test_the_limit_sources_are_the_ones_the_quotas_table_computes(conn: Any) -> None:
    """What computes `limit_source`: the trigger of migration 0029 on one PostgreSQL, the generated
    column of 0001 where it still is (Citus); in both, the sources are the CASE's results."""
    generated = conn.execute(
        "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d"
        " JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
        " WHERE d.adrelid = 'quotas'::regclass AND a.attname = 'limit_source'"
    ).fetchone()
    if generated is None:
        generated = conn.execute(
            "SELECT p.prosrc FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
            " WHERE t.tgrelid = 'quotas'::regclass AND t.tgname = 'quotas_effective_limit'"
            " AND t.tgenabled = 'O'"
        ).fetchone()
        assert generated is not None, "limit_source is neither generated nor kept by the trigger"
    sources = re.findall(r"(?:THEN|ELSE) '([^']*)'", generated[0])
    assert sources and set(sources) == set(v.LimitSource)

"""What only a Citus cluster shows: migration 0012 distributed the tables by account, every hot
statement is routed to one shard, and the ledger stays append-only on the shards. Runs in the Citus
run (QUOTA_TEST_CITUS=1, .ci/run); the suite's own tests marked `citus` cover the guarantees."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from service.billing.apply import billing_deliver, deliver_params
from service.billing.events import Envelope, PlanKeys, SubscriptionChange
from service.db import Q
from service.errors import QuotaExhausted
from service.plans import PlanConfig
from service.quota import admin, chain, overrides, reset, takes
from tests.citus import on_cluster
from tests.db.helpers import new_account, set_override

pytestmark = pytest.mark.skipif(
    not on_cluster(), reason="runs on the Citus cluster only (QUOTA_TEST_CITUS=1 pytest -m citus; .ci/run)"
)

ACCOUNT_TABLES = ("accounts", "quotas", "ledger", "audit_log", "grants")
REFERENCE_TABLES = ("api_keys", "job_runs", "webhook_events", "subscriptions", "customer_links")
# Distributed by their own key, in a co-location group of their own.
OWN_KEY_TABLES = ("stripe_customers",)
# The per-account statements of a take, a release, an account read, an admin reset and a billing
# change's lock. Each must run on the one shard that holds the account. (An override, a soft delete
# and a restore are one call of several statements each: test_an_audited_admin_change_...)
HOT = (
    "take_delegated",
    "take",
    "take_refusal",
    "take_by_key",
    "roll_over",
    "release",
    "release_refusal",
    "account_upsert",
    "ensure_quotas",
    "account_get",
    "account_quotas",
    "audit",
    "usage_open",
    "usage_from_ledger",
    "admin_reset",
    "account_lock",
    "account_customer_for_update",
)
# A Stripe customer's claim (the account upsert's transaction): one shard, the customer's.
CUSTOMER = ("stripe_customer_claim", "stripe_customer_release")
PARAMS: dict[str, Any] = {
    "account_id": "acc-1",
    "metric": "urls",
    "metrics": ["urls", "seats"],
    "periods": ["2026-01", "held"],
    "kinds": ["consumable", "allocation"],
    "resets": ["month", None],
    "units": 1,
    "period": "2026-01",
    "idempotency_key": "k",
    "actor": "t",
    "take_id": 1,
    "kind": "user",
    "plan": "free",
    "free_plan": "free",
    "stripe_customer_id": None,
    "lapsed": False,
    "plan_limits": [10, 1],
    "free_limits": [10, 1],
    "override_set": True,
    "override_limit": 5,
    "action": "x",
    "old": None,
    "new": None,
    "customer_id": "cus_1",
}


def test_account_tables_are_distributed_and_colocated_and_the_rest_are_reference_tables(conn):
    rows = dict(
        conn.execute(
            "SELECT logicalrelid::text, partmethod::text || ':' || colocationid FROM pg_dist_partition"
        ).fetchall()
    )
    assert {rows[t][0] for t in ACCOUNT_TABLES} == {"h"}
    assert len({rows[t] for t in ACCOUNT_TABLES}) == 1, rows  # one co-location group
    assert {rows[t][0] for t in REFERENCE_TABLES} == {"n"}, rows
    for table in OWN_KEY_TABLES:
        assert rows[table][0] == "h" and rows[table] not in {rows[t] for t in ACCOUNT_TABLES}, rows


# Statements whose data-modifying CTEs Citus plans as steps (README "Scaling out"): the counter's
# UPDATE on its shard, its result back to the coordinator, the ledger INSERT on the same shard
# group, all in one distributed transaction. One shard, but two round trips, not one router task.
STEPPED = {"take", "roll_over", "release", "admin_reset", "ensure_quotas"}


def _explain(conn: psycopg.Connection[Any], name: str, params: dict[str, Any] = PARAMS) -> str:
    with psycopg.ClientCursor(conn) as cur:
        rows = cur.execute("EXPLAIN (COSTS OFF) " + _planned(conn, name), params).fetchall()
    return "\n".join(r[0] for r in rows)


# The writers (migrations/repeatable/) are functions whose body is the statement they run: what Citus
# plans is that body, with the query's parameters in place of p_<name>.
_WRITER = re.compile(
    r"\b(ledger_(?:take|roll_over|release|admin_reset|reset_group)|audit_append|billing_lock_account"
    r"|quota_sync_lock_accounts)\("
)


def _planned(conn: psycopg.Connection[Any], name: str) -> str:
    found = _WRITER.search(getattr(Q, name))
    if found is None:
        return getattr(Q, name)
    source = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", (found[1],)).fetchone()[0]
    body = source.split("BEGIN", 1)[1].rsplit("END", 1)[0] if "BEGIN" in source else source
    if "FOR r IN" in body:  # a writer that loops over its statement's rows (ledger_admin_reset)
        body = body.split("FOR r IN", 1)[1].split("\nLOOP", 1)[0]
    body = body.replace("RETURN QUERY", "")
    body = re.sub(r"\n\s*INTO [^\n]*", "", body)  # a writer that reads its row into variables (ledger_take)
    body = re.sub(r"--[^\n]*", "", body)  # comments (some hold a ";")
    body = body.split(";", 1)[0].strip()  # the statement, without what the writer does after it
    return re.sub(r"\bp_(\w+)", r"%(\1)s", body)


def _assert_one_shard_per_step(conn: psycopg.Connection[Any], plan: str) -> None:
    counts = re.findall(r"Task Count: (\d+)", plan)
    assert counts and set(counts) == {"1"}, plan  # no step fans out over shards
    # Every step that reads or writes a table does it on the account's shards, which are co-located:
    # the same shard index (the one holding the account) in every shard name, on one node.
    shards = set(re.findall(r" on (?:accounts|quotas|ledger|audit_log)_(\d+)", plan))
    if shards:
        groups = conn.execute(
            "SELECT count(DISTINCT shardminvalue) FROM pg_dist_shard WHERE shardid = ANY(%s)",
            ([int(s) for s in shards],),
        ).fetchone()[0]
        assert groups == 1, plan


@pytest.mark.parametrize("name", HOT)
def test_hot_statement_touches_one_shard(conn, name):
    plan = _explain(conn, name)
    _assert_one_shard_per_step(conn, plan)
    if name not in STEPPED:
        assert "Subplan" not in plan, plan  # one router task: one round trip to the shard


@pytest.mark.parametrize("name", CUSTOMER)
def test_a_customer_claim_is_one_router_task(conn, name):
    plan = _explain(conn, name)
    assert re.findall(r"Task Count: (\d+)", plan) == ["1"], plan
    assert "Subplan" not in plan, plan


def _delivery(plans: PlanConfig, *, account_id: str, resolved: bool, event_id: str) -> dict[str, Any]:
    env = Envelope(
        provider="stripe",
        event_id=event_id,
        type="customer.subscription.updated",
        occurred_at=datetime(2026, 1, 5, tzinfo=UTC),
        body="{}",
        data={},
    )
    change = SubscriptionChange(
        subscription_id=f"sub_{event_id}",
        account_ids=(account_id,),
        customer_id=f"cus_{event_id}",
        plan_keys=PlanKeys(stripe_prices=("pro_monthly",)),
        status="active",
        status_if_new="active",
    )
    return deliver_params(
        plans, env, change, actor="t", store=True, locked=False, account_id=account_id, resolved=resolved
    )


def _commands(conn: psycopg.Connection[Any], work: Callable[[], object]) -> list[str]:
    """The commands the coordinator sends to the nodes (or runs on its own placements) for `work`."""
    sent: list[str] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        for prefix in ("issuing ", "executing the command locally: "):
            if message.startswith(prefix):
                sent.append(message.removeprefix(prefix))

    conn.execute("SET citus.log_remote_commands = on")
    conn.execute("SET citus.log_local_commands = on")
    conn.add_notice_handler(keep)
    try:
        work()
    finally:
        conn.remove_notice_handler(keep)
        conn.execute("RESET citus.log_remote_commands")
        conn.execute("RESET citus.log_local_commands")
    return sent


@pytest.mark.parametrize("resolved", [False, True])
def test_a_webhook_delivery_touches_its_accounts_shard_alone(conn, plans, resolved):
    """A delivery (billing_deliver, one call run on the coordinator) sends each of its statements to
    the account's shard (the account's lock and update, its counters' limits and their audit rows)
    or to the billing tables' reference copies: every command that names an account table names a
    shard of the one shard group that holds the account, and the account's row is locked there."""
    account = new_account(conn, plans)
    params = _delivery(plans, account_id=account, resolved=resolved, event_id=f"evt_{resolved}")

    sent = _commands(conn, lambda: billing_deliver(conn, params))

    assert conn.execute(
        "SELECT plan, subscription_status FROM accounts WHERE id = %s", (account,)
    ).fetchone() == (
        "pro",
        "active",
    )
    shards = _account_shards(conn, sent)
    assert {t for t, _ in shards} == {"accounts", "quotas", "audit_log"}, sent  # limits followed the plan
    [holder] = conn.execute(
        "SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 'accounts'::regclass"
        " AND get_shard_id_for_distribution_column('accounts', %s::text) = shardid",
        (account,),
    ).fetchone()
    assert ("accounts", holder) in shards, sent
    assert any(re.search(rf"accounts_{holder} a WHERE .* FOR NO KEY UPDATE", c) for c in sent), sent


def _account_shards(conn: psycopg.Connection[Any], sent: list[str]) -> set[tuple[str, int]]:
    """The account tables' shards that `sent` names, asserted to be one shard group's."""
    shards = {
        (table, int(shard))
        for command in sent
        for table, shard in re.findall(r"\b(accounts|quotas|ledger|audit_log)_(\d+)\b", command)
    }
    groups = conn.execute(
        "SELECT count(DISTINCT shardminvalue) FROM pg_dist_shard WHERE shardid = ANY(%s)",
        ([s for _, s in shards],),
    ).fetchone()[0]
    assert groups == 1, sent
    return shards


def test_an_audited_admin_change_touches_its_accounts_shard_alone(conn, plans):
    """An override, a soft delete, a restore: each one call (the change and its audit row, as the
    owner: quota_set_override, account_set_deleted) whose every command is on the account's shards."""
    account = new_account(conn, plans)
    for work in (
        lambda: overrides.set_override(conn, plans, account_id=account, metric="urls", limit=5, actor="t"),
        lambda: admin.soft_delete(conn, account_id=account, actor="t"),
        lambda: admin.restore(conn, account_id=account, actor="t"),
    ):
        assert {t for t, _ in _account_shards(conn, _commands(conn, work))} >= {"quotas", "audit_log"}
    assert conn.execute("SELECT count(*) FROM audit_log WHERE account_id = %s", (account,)).fetchone() == (3,)


def test_finding_a_deliverys_account_reads_the_named_accounts_shard_alone(conn):
    """billing_account, the read before the account's part when the event names no existing
    account: the billing tables are read where they are (reference tables), accounts on the shard of
    the id the event names, stripe_customers on the customer's."""
    params = {"provider": "stripe", "account_ids": ["acc-1"], "subscription_id": "s", "customer_id": "c"}
    _assert_one_shard_per_step(conn, _explain(conn, "billing_account", params))


def test_a_refund_finds_its_grant_on_every_shard_then_rereads_it_on_the_accounts_alone(conn, plans):
    """credit_purchased: the refund's resolve asks every grants shard for the payment's grant; under
    the account's lock the read names the account, so it stays on that shard (each checked on the
    sixth call, past the five custom plans PL/pgSQL makes before it may keep a generic one)."""
    account = new_account(conn, plans)
    grant = {"account_id": account, "metric": "urls", "units": 10, "expires_at": None, "provider": "stripe",
             "reference": "cs_1", "note": None, "actor": "t", "payment_ref": "pi_1"}  # fmt: skip
    conn.execute(Q.credit_grant, grant)
    read = {"provider": "stripe", "payment_ref": "pi_1", "reference": None}

    def shards(account_id: str | None) -> set[int]:
        params = read | {"account_id": account_id}
        sent: list[str] = []
        for _ in range(6):
            sent = _commands(conn, lambda: conn.execute(Q.credit_purchased, params))
        return {int(s) for s in re.findall(r"\bgrants_(\d+)\b", " ".join(sent))}

    every = "SELECT array_agg(shardid) FROM pg_dist_shard WHERE logicalrelid = 'grants'::regclass"
    assert shards(None) == set(conn.execute(every).fetchone()[0])
    [holder] = conn.execute(
        "SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 'grants'::regclass"
        " AND get_shard_id_for_distribution_column('grants', %s::text) = shardid",
        (account,),
    ).fetchone()
    assert shards(account) == {holder}


@pytest.mark.parametrize("table", ["ledger", "audit_log"])
@pytest.mark.parametrize("change", ["UPDATE {t} SET actor = 'x'", "DELETE FROM {t}", "TRUNCATE {t}"])
def test_append_only_on_the_shards_even_for_a_superuser(conn, plans, table, change):
    account = new_account(conn, plans)
    takes.take(conn, plans, account_id=account, metric="urls", actor="t")
    conn.execute("INSERT INTO audit_log (actor, action, account_id) VALUES ('t', 'x', %s)", (account,))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"^{table} is append-only"):
        conn.execute(change.format(t=table))
    assert conn.execute(f"SELECT count(*) FROM {table} WHERE actor <> 'x'").fetchone()[0] >= 1


def test_the_login_role_takes_and_releases_on_the_cluster(conn, app_db_url, plans):
    """Grants reach the shards: the service's login role (a member of quota_app) works there."""
    account = new_account(conn, plans)
    with psycopg.connect(app_db_url, autocommit=True) as app:
        t = takes.take(app, plans, account_id=account, metric="urls", actor="t")
        assert takes.release(app, take_id=t.take_id, actor="t", account_id=account).released
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("UPDATE ledger SET actor = 'x'")


# --- cross-account jobs: batches of one shard --------------------------------------------------------

EARLIER = "2001-01"


def _spread_accounts(conn: psycopg.Connection[Any], plans: Any, n: int = 16) -> list[str]:
    """`n` accounts, which the hash spreads over the shards, their counters (with usage) in an
    earlier month."""
    accounts = [new_account(conn, plans) for _ in range(n)]
    for account in accounts:
        takes.take(conn, plans, account_id=account, metric="urls", actor="t")
    conn.execute("UPDATE quotas SET period = %s", (EARLIER,))
    return accounts


def _shards(conn: psycopg.Connection[Any], accounts: list[str]) -> set[int]:
    return {r[0] for r in conn.execute("SELECT account_shard(a) FROM unnest(%s::text[]) a", (accounts,))}


def _reset_groups(conn: psycopg.Connection[Any], period: str) -> list[dict[str, Any]]:
    params = {"period": period, "batch_size": 3, "pick_size": 1000, **reset._START}
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q.reset_pick, params).fetchall()


def _statement(name: str) -> str:
    """A named query without its comments."""
    return "\n".join(line for line in getattr(Q, name).splitlines() if not line.lstrip().startswith("--"))


def test_the_reset_picks_batches_of_one_shard(conn, plans):
    accounts = _spread_accounts(conn, plans)
    groups = _reset_groups(conn, "2026-01")
    assert all(len(_shards(conn, g["account_ids"])) == 1 for g in groups), groups
    assert len(_shards(conn, accounts)) > 1  # the accounts span shards, so the batches do too
    assert {a for g in groups for a in g["account_ids"]} == set(accounts)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("reset_pick", {"period": "2026-01", "batch_size": 3, "pick_size": 24, **reset._START}),
        ("reset_pending", {"period": "2026-01"}),
        ("plan_sync_pick", {"after": "", "batch_size": 10}),
    ],
)
def test_the_reads_that_pick_batches_lock_nothing(conn, name, params):
    """They read every shard, so they must not lock: the locks are taken by the batch statements."""
    assert not re.search(r"FOR\s+(UPDATE|SHARE|NO KEY|KEY)", _statement(name)), name
    assert "LockRows" not in _explain(conn, name, params)


def test_each_reset_batch_locks_and_changes_one_shard(conn, plans):
    """The statement that locks counters, moves them to the new month and writes their reset rows,
    as the reset runs it for each batch reset_pick made: every step on the batch's one shard."""
    _spread_accounts(conn, plans)
    groups = _reset_groups(conn, "2026-01")
    assert len(groups) > 1
    assert "FOR UPDATE" in _planned(conn, "reset_group")
    for group in groups:
        params = {**group, "period": "2026-01", "actor": "t"}
        _assert_one_shard_per_step(conn, _explain(conn, "reset_group", params))


def test_each_plan_sync_batch_locks_one_shard(conn, plans):
    accounts = [new_account(conn, plans) for _ in range(16)]
    with conn.cursor(row_factory=dict_row) as cur:
        groups = cur.execute(Q.plan_sync_pick, {"after": "", "batch_size": 100}).fetchall()
    assert len(groups) > 1 and {a for g in groups for a in g["group_ids"]} == set(accounts)
    for group in groups:
        assert len(_shards(conn, group["group_ids"])) == 1
        params = {"group_ids": group["group_ids"], "free_plan": "free"}
        _assert_one_shard_per_step(conn, _explain(conn, "plan_sync_lock_accounts", params))
        ids = group["group_ids"]
        targets = {
            "account_ids": ids,
            "metrics": ["urls"] * len(ids),
            "plan_limits": [1] * len(ids),
            "free_limits": [1] * len(ids),
            "lapsed": [False] * len(ids),
        }
        _assert_one_shard_per_step(conn, _explain(conn, "plan_sync_diff", {**targets, "group_ids": ids}))


# Why the take on Citus is a delegated function (README "Scaling out", "One round trip per take"):
# what Citus does with the statement and with a function, held here so that a Citus upgrade that
# changes it shows.
_PROBE = """
CREATE FUNCTION take_probe(p_account_id text, OUT id bigint) LANGUAGE plpgsql AS $$
BEGIN
    id := nextval('ledger_id_seq');
END
$$;
SELECT create_distributed_function('take_probe(text)', 'p_account_id', colocate_with := 'quotas');
"""


def test_the_take_statement_cannot_be_one_router_task(conn):
    """Even with the ledger INSERT's account a parameter, an INSERT ... SELECT from a modifying CTE
    is planned as steps; and a routed UPDATE may not draw the chain's id (a volatile function)."""
    assert "Distributed Subplan" in _explain(conn, "take")
    with pytest.raises(psycopg.Error, match="must not be VOLATILE"):
        conn.execute("UPDATE quotas SET chain_id = nextval('ledger_id_seq') WHERE account_id = 'acc-1'")


def test_a_delegated_function_runs_on_the_accounts_worker_and_draws_ids_from_its_range(conn, plans):
    account = new_account(conn, plans)
    conn.execute(_PROBE)
    with psycopg.ClientCursor(conn) as cur:
        plan = "\n".join(
            r[0] for r in cur.execute("EXPLAIN (COSTS OFF) SELECT * FROM take_probe(%s)", (account,))
        )
        assert "Task Count: 1" in plan and "Function Scan on take_probe" in plan, plan
        # a volatile argument (the coordinator's id) is evaluated there instead: not delegated
        volatile = "EXPLAIN (COSTS OFF) SELECT * FROM take_probe(%s || nextval('ledger_id_seq'))"
        assert "Task Count" not in "\n".join(r[0] for r in cur.execute(volatile, (account,)))
    worker_id = conn.execute("SELECT id FROM take_probe(%s)", (account,)).fetchone()[0]
    coordinator_id = conn.execute("SELECT nextval('ledger_id_seq')").fetchone()[0]
    # Each worker draws from its own range (group g from g * 2^48 + 1), the coordinator from 1: ids
    # are unique, not in chain order, which is why the chain has its own position (migrations/0015).
    assert worker_id > 2**48 > coordinator_id


def test_the_take_is_one_call_delegated_to_the_accounts_worker(conn, plans):
    """The service's take on the cluster (take_delegated): one task, the function run on the node
    that holds the account (its id drawn from that node's range), a chain that follows by seq
    (the rollover's id is drawn on the account's node too: ledger_link, which draws it, runs where
    its row is), and a refused take that moves nothing."""
    account = new_account(conn, plans)
    assert takes.on_citus(conn)
    plan = _explain(conn, "take_delegated", {**PARAMS, "account_id": account})
    assert "Task Count: 1" in plan and "Function Scan on take_delegated" in plan, plan
    assert "Subplan" not in plan, plan
    set_override(conn, account, "urls", 2)
    conn.execute("UPDATE quotas SET period = %s WHERE account_id = %s", (EARLIER, account))
    # a unit held in the earlier month, taken there (so the chain holds it: verify checks used_after)
    takes.take(conn, plans, account_id=account, metric="urls", actor="t", period=EARLIER)
    first = takes.take(conn, plans, account_id=account, metric="urls", actor="t")  # rolls over first
    second = takes.take(conn, plans, account_id=account, metric="urls", actor="t")
    with pytest.raises(QuotaExhausted):
        takes.take(conn, plans, account_id=account, metric="urls", actor="t")
    assert first.take_id > 2**48 and second.take_id > 2**48 and second.used == 2
    got = conn.execute(
        "SELECT kind, seq, id > 2^48 FROM ledger WHERE account_id = %s ORDER BY seq", (account,)
    ).fetchall()
    assert got == [("take", 1, True), ("reset", 2, True), ("take", 3, True), ("take", 4, True)]
    assert chain.verify(conn, account_id=account).ok


def test_a_multi_line_take_touches_its_accounts_shard_alone(conn, plans):
    """ledger_take_lines, one call run on the coordinator: each of its steps (the lock of the lines'
    counters in metric order, their UPDATE, the ledger rows) is sent to the account's shards, and
    all the lines are taken or none."""
    account = new_account(conn, plans)
    lines = [takes.Line(metric="urls", units=2), takes.Line(metric="seats")]
    set_override(conn, account, "seats", 10)
    takes.take_lines(conn, plans, account_id=account, lines=lines, actor="t")  # counters created first
    sent = _commands(
        conn,
        lambda: takes.take_lines(
            conn, plans, account_id=account, lines=lines, idempotency_key="k", actor="t"
        ),
    )
    assert {t for t, _ in _account_shards(conn, sent)} >= {"quotas", "ledger"}, sent
    set_override(conn, account, "seats", 2)
    with pytest.raises(QuotaExhausted):
        takes.take_lines(conn, plans, account_id=account, lines=lines, actor="t")
    used = dict(conn.execute("SELECT metric, used FROM quotas WHERE account_id = %s", (account,)).fetchall())
    assert (used["urls"], used["seats"]) == (4, 2)
    assert chain.verify(conn, account_id=account).ok


def test_a_batch_on_the_cluster_delegates_each_item_to_its_accounts_worker(conn, plans):
    """On Citus a batch's items go one by one (one transaction may not span shards): each item's
    take is a take_delegated call, and a refused item is answered as its single take would be."""
    accounts = _spread_accounts(conn, plans, 4)
    set_override(conn, accounts[0], "urls", 1)
    items = [takes.TakeItem(account_id=a, metric="urls") for a in accounts] + [
        takes.TakeItem(account_id=accounts[0], metric="urls")
    ]
    sent = _commands(conn, lambda: takes.take_each(conn, plans, items, actor="t"))
    got = takes.take_each(conn, plans, items, actor="t")
    assert all(isinstance(r, takes.Take) for r in got[1:4]) and isinstance(got[0], QuotaExhausted)
    assert sum("take_delegated" in c for c in sent) >= len(items)
    assert not any("ledger_take_each" in c for c in sent), sent

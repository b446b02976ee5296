"""The service's own login role writes the ledger, the counters' chain heads, the audit log and API
keys only through the service's operations (migrations/0016, migrations/repeatable/): the probe of
issue 21 (a chained take of 40 units backdated into a closed month, naming an admin key, and the
head moved to it) is refused, as is a key it makes up and an audit row it makes up; each audited
operation writes exactly its own row, and no row changes. And the ledger's columns are held to their
rules by CHECK constraints."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from service import audit, keys
from service.billing import apply
from service.plans import PlanConfig, parse_plans
from service.quota import admin, overrides, takes
from service.quota.plan_sync import sync_plans
from tests.db.helpers import new_account

METRIC = "urls"
CLOSED = "2020-01"
Conn = psycopg.Connection[Any]


@pytest.fixture
def app(app_db_url: str) -> Any:
    """An autocommit connection as the service's login role (a member of quota_app, nothing more)."""
    with psycopg.connect(app_db_url, autocommit=True) as c:
        assert c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (False,)
        yield c


def _forge(app: Conn, account: str) -> None:
    """Issue 21's probe: the next link of the counter's chain, as the service would hash it."""
    seq, head, lim = app.execute(
        "SELECT chain_seq, chain_hash, lim FROM quotas WHERE account_id = %s AND metric = %s",
        (account, METRIC),
    ).fetchone()
    app.execute(
        """INSERT INTO ledger (id, at, seq, account_id, metric, period, kind, units, used_after, lim, actor,
                               prev_hash, hash)
           OVERRIDING SYSTEM VALUE
           SELECT e.id, e.at, %(seq)s, %(a)s::text, %(m)s, %(p)s, 'take', 40, 41, %(lim)s, 'test-admin',
                  %(head)s,
                  ledger_hash(%(head)s, e.id, e.at, %(a)s, %(m)s, %(p)s, 'take', 40, 41, %(lim)s, NULL, NULL,
                              'test-admin')
             FROM (SELECT nextval('ledger_id_seq') AS id, '2020-01-15'::timestamptz AS at) AS e""",
        {"seq": seq + 1, "a": account, "m": METRIC, "p": CLOSED, "lim": lim, "head": head},
    )


def test_the_probe_s_forged_row_is_refused(conn: Conn, app: Conn, plans: Any) -> None:
    account = new_account(conn, plans)
    takes.take(conn, plans, account_id=account, metric=METRIC, actor="t")
    before = conn.execute("SELECT * FROM quotas WHERE account_id = %s", (account,)).fetchall()
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="ledger"):
        _forge(app, account)
    head_moves = {
        "chain head": "UPDATE quotas SET chain_seq = chain_seq + 1, chain_hash = sha256('x')",
        "counter": "UPDATE quotas SET used = 0",
        "period": f"UPDATE quotas SET period = '{CLOSED}'",
        "counter removed": "DELETE FROM quotas",
    }
    for what, statement in head_moves.items():
        with pytest.raises(psycopg.errors.InsufficientPrivilege), app.transaction():
            app.execute(statement + " WHERE account_id = %s", (account,))
            pytest.fail(f"{what}: allowed")
    after = conn.execute("SELECT * FROM quotas WHERE account_id = %s", (account,)).fetchall()
    assert after == before
    assert conn.execute("SELECT count(*) FROM ledger WHERE account_id = %s", (account,)).fetchone() == (1,)


def test_the_chain_append_is_the_owner_s_alone(app: Conn) -> None:
    """ledger_link draws ids and hashes links; only the writers, running as the owner, call it."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="ledger_link"):
        app.execute(
            "SELECT * FROM ledger_link(0, NULL, 'a', 'm', '2020-01', 'take', 1, 1, NULL, NULL, NULL, 'x')"
        )


def test_the_service_s_role_still_does_its_work(conn: Conn, app: Conn, plans: Any) -> None:
    """What the service does directly stays allowed: accounts and their counters created; takes and
    releases through the writers."""
    account = new_account(app, plans)
    taken = takes.take(app, plans, account_id=account, metric=METRIC, actor="t")
    assert takes.release(app, take_id=taken.take_id, actor="t").released


def test_a_counter_s_limits_change_only_with_their_audit_row(conn: Conn, app: Conn, plans: Any) -> None:
    """The limits, the override and the deletion flag of an existing counter change only in the
    functions that audit the change: the service's role may not UPDATE them."""
    account = new_account(conn, plans)
    before = conn.execute("SELECT * FROM quotas WHERE account_id = %s", (account,)).fetchall()
    for column, value in {
        "override_set": "true",
        "override_limit": "5",
        "plan_limit": "7",
        "free_limit": "7",
        "lapsed": "true",
        "account_deleted": "true",
    }.items():
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="quotas"):
            app.execute(f"UPDATE quotas SET {column} = {value} WHERE account_id = %s", (account,))
    assert conn.execute("SELECT * FROM quotas WHERE account_id = %s", (account,)).fetchall() == before


def test_the_service_s_role_appends_no_audit_row_of_its_own(conn: Conn, app: Conn, plans: Any) -> None:
    """Neither directly nor through the owner's helpers: only the functions that make a change write
    its audit row."""
    account = new_account(conn, plans)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="audit_log"):
        app.execute(
            "INSERT INTO audit_log (actor, action, account_id, at)"
            " VALUES ('test-admin', 'forged', %s, now())",
            (account,),
        )
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="audit_append"):
        audit.record(app, actor="test-admin", action="forged", account_id=account, old=None, new=None)
    helpers = {
        "quota_set_plan_limits": "SELECT * FROM quota_set_plan_limits(%s, '{urls}', '{1}', '{1}', '{f}',"
        " 'x')",
        "quota_set_plan_limits_batch": "SELECT * FROM quota_set_plan_limits_batch(ARRAY[%s], '{urls}',"
        " '{1}', '{1}', '{f}', 'x')",
        "quota_set_limits_for_plan": "SELECT quota_set_limits_for_plan(%s, 'pro', false, 'x', 'free',"
        " '{pro}', '{urls}', '{1}')",
    }
    for name, statement in helpers.items():
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=name):
            app.execute(statement, (account,))
    assert conn.execute("SELECT count(*) FROM audit_log").fetchone() == (0,)
    assert conn.execute(
        "SELECT plan_limit FROM quotas WHERE account_id = %s AND metric = %s", (account, METRIC)
    ).fetchone() == (50,)


def _audited(conn: Conn, seen: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The audit rows written since `seen` was read (and `seen` brought up to date)."""
    rows = conn.execute(
        "SELECT action, actor, account_id, metric, old, new FROM audit_log ORDER BY id"
    ).fetchall()
    new, seen[:] = rows[len(seen) :], rows
    return new


def test_each_audited_change_writes_exactly_its_row_as_the_service_s_role(
    conn: Conn, app: Conn, plans: PlanConfig
) -> None:
    """Overrides, delete and restore, the admin reset, a plan change, plan sync: run as the service's
    role, each writes its one audit row (one per changed limit), a call that changes nothing none."""
    account = new_account(app, plans)
    seen: list[tuple[Any, ...]] = []
    overrides.set_override(app, plans, account_id=account, metric=METRIC, limit=5, actor="adm")
    assert _audited(conn, seen) == [("override_set", "adm", account, METRIC, None, {"limit": 5})]
    overrides.set_override(app, plans, account_id=account, metric=METRIC, limit=5, actor="adm")
    assert _audited(conn, seen) == []
    overrides.clear_override(app, plans, account_id=account, metric=METRIC, actor="adm")
    assert _audited(conn, seen) == [("override_cleared", "adm", account, METRIC, {"limit": 5}, None)]
    assert admin.soft_delete(app, account_id=account, actor="adm")
    assert not admin.soft_delete(app, account_id=account, actor="adm")
    assert admin.restore(app, account_id=account, actor="adm")
    assert _audited(conn, seen) == [
        ("account_deleted", "adm", account, None, {"deleted": False}, {"deleted": True}),
        ("account_restored", "adm", account, None, {"deleted": True}, {"deleted": False}),
    ]
    takes.take(app, plans, account_id=account, metric=METRIC, actor="t", units=2)
    assert admin.reset_counter(app, plans, account_id=account, metric=METRIC, actor="adm") == 2
    [(action, actor, *_)] = _audited(conn, seen)
    assert (action, actor) == ("counter_reset", "adm")

    conn.execute(
        "INSERT INTO subscriptions (provider, subscription_id, account_id, plan, status, event_at, event_id)"
        " VALUES ('stripe', 'sub_1', %s, 'pro', 'active', now(), 'evt_1')",
        (account,),
    )
    with app.transaction():
        apply.set_tier(app, plans, apply.lock_accounts(app, [account]), actor="webhook")
    changed = _audited(conn, seen)
    assert {(a, actor, m) for a, actor, _, m, _, _ in changed} == {
        ("plan_limit_changed", "webhook", m) for m in plans.metrics
    }
    assert conn.execute(
        "SELECT plan_limit FROM quotas WHERE account_id = %s AND metric = %s", (account, METRIC)
    ).fetchone() == (500,)

    bigger = parse_plans(
        {"free_plan": "free", "plans": {"free": {"limits": {"urls": 50}}, "pro": {"limits": {"urls": 600}}}}
    )
    assert sync_plans(app, bigger, actor="sync").changes >= 1
    synced = _audited(conn, seen)
    assert (
        "plan_limit_changed",
        "sync",
        account,
        METRIC,
        {"plan_limit": 500, "free_limit": 50, "lapsed": False},
        {"plan_limit": 600, "free_limit": 50, "lapsed": False},
    ) in synced
    assert {a for a, *_ in synced} == {"plan_limit_changed"}
    assert sync_plans(app, bigger, actor="sync").changes == 0
    assert _audited(conn, seen) == []


def test_audit_rows_cannot_be_changed_or_removed(conn: Conn, app: Conn, plans: Any) -> None:
    """The service's role appends audit rows only by the changes it makes, and never changes or
    removes one."""
    account = new_account(app, plans)
    assert admin.soft_delete(app, account_id=account, actor="t")
    for statement in ("UPDATE audit_log SET actor = 'someone-else'", "DELETE FROM audit_log"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="audit_log"):
            app.execute(statement)
        app.rollback()
    assert conn.execute("SELECT actor FROM audit_log WHERE action = 'account_deleted'").fetchall() == [("t",)]


def test_a_key_the_service_s_role_makes_up_does_not_authenticate(conn: Conn, app: Conn) -> None:
    secret = keys.PREFIX + "made-up-by-the-app-role"
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="api_keys"):
        app.execute(
            "INSERT INTO api_keys (name, role, key_hash) VALUES ('forged', 'admin', %s)",
            (keys.hash_key(secret),),
        )
    assert keys.verify_key(app, secret) is None
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="api_keys"):
        keys.create_key(app, name="forged", role="admin", actor="t")
    assert keys.verify_key(app, secret) is None


def test_keys_are_changed_by_the_owner_only(conn: Conn, app: Conn) -> None:
    """The owner (`quota-ledger keys`, as `migrate` runs) creates and revokes; the service reads."""
    secret = keys.create_key(conn, name="owner-made", role="product")
    assert keys.verify_key(app, secret) == keys.KeyOwner(name="owner-made", role="product")
    for statement in (
        "UPDATE api_keys SET role = 'admin' WHERE name = 'owner-made'",
        "UPDATE api_keys SET revoked_at = now() WHERE name = 'owner-made'",
        "DELETE FROM api_keys WHERE name = 'owner-made'",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="api_keys"):
            app.execute(statement)
    assert keys.revoke_key(conn, name="owner-made")
    assert keys.verify_key(app, secret) is None


def test_every_definer_function_fixes_its_search_path(conn: Conn) -> None:
    """A SECURITY DEFINER function resolving names by its caller's search_path could be redirected to
    the caller's own objects (a temporary table named ledger, say)."""
    loose = conn.execute(
        "SELECT p.proname, p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'public' AND p.prosecdef"
        " AND NOT EXISTS (SELECT FROM unnest(p.proconfig) c WHERE c LIKE 'search\\_path=%%, pg\\_temp')"
    ).fetchall()
    assert loose == []


def _insert_row(conn: Conn, account: str, **columns: object) -> None:
    row = {"account_id": account, "seq": 1, "prev_hash": None, "hash": b"\x00" * 32, **columns}
    conn.execute(
        "INSERT INTO ledger"
        " (account_id, metric, period, kind, units, used_after, actor, seq, prev_hash, hash)"
        " VALUES (%(account_id)s, 'urls', '2020-01', 'take', 1, 1, 'x', %(seq)s, %(prev_hash)s, %(hash)s)",
        row,
    )


@pytest.mark.parametrize(
    "columns",
    [
        {"account_id": ""},
        {"account_id": "has space"},
        {"account_id": "a" * 129},
        {"hash": b"\x00" * 31},
        {"seq": 2},  # no previous hash after the first row
        {"prev_hash": b"\x00" * 32},  # a previous hash at the first row
        {"seq": 2, "prev_hash": b"\x00" * 33},
    ],
)
def test_the_ledger_s_columns_follow_their_rules(conn: Conn, columns: dict[str, object]) -> None:
    """Even the owner, who bypasses no CHECK: verify then never meets a row it cannot walk."""
    with pytest.raises(psycopg.errors.CheckViolation):
        _insert_row(conn, "acc-rules", **columns)
    _insert_row(conn, "acc-rules", seq=3, prev_hash=b"\x01" * 32)  # the rules allow a well-formed row


def test_keys_create_as_the_service_s_role_says_to_run_it_as_the_owner(app_db_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": app_db_url}
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "keys", "create", "--role", "admin", "--name", "ops"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "owner" in done.stderr, done.stderr

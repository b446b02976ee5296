"""Feature overrides (migrations/0023, migrations/repeatable/features.sql): the service's role reads
them and writes them only through feature_set_override, which writes the audit row in the same call;
concurrent calls that would make the same change write one audit row between them."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from service.errors import UnknownAccount
from service.quota import features
from tests.db.helpers import new_account
from tests.db.race import race

THREADS = 8
Conn = psycopg.Connection[Any]


@pytest.fixture
def app(app_db_url: str) -> Any:
    """An autocommit connection as the service's login role (a member of quota_app, nothing more)."""
    with psycopg.connect(app_db_url, autocommit=True) as c:
        yield c


def _audit(conn: Conn, account: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT actor, action, metric, old, new FROM audit_log WHERE account_id = %s ORDER BY id", (account,)
    ).fetchall()


def test_the_service_s_role_writes_overrides_only_through_the_audited_call(
    conn: Conn, app: Conn, plans
) -> None:
    account = new_account(app, plans)
    for statement in (
        "INSERT INTO account_features (account_id, feature, enabled) VALUES (%s, 'sso', true)",
        "UPDATE account_features SET enabled = false WHERE account_id = %s",
        "DELETE FROM account_features WHERE account_id = %s",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="account_features"):
            app.execute(statement, (account,))
    assert (
        features.set_override(app, plans, account_id=account, feature="sso", enabled=True, actor="adm")
        is None
    )
    assert features.clear_override(app, plans, account_id=account, feature="sso", actor="adm") is True
    assert _audit(conn, account) == [
        ("adm", "feature_override_set", "sso", None, {"enabled": True}),
        ("adm", "feature_override_cleared", "sso", {"enabled": True}, None),
    ]
    assert conn.execute("SELECT count(*) FROM account_features").fetchone() == (0,)


def test_concurrent_identical_sets_audit_once(conn: Conn, plans: Any, connect: Any) -> None:
    account = new_account(conn, plans)
    results = race(
        connect(THREADS),
        lambda c: features.set_override(
            c, plans, account_id=account, feature="sso", enabled=False, actor="race"
        ),
    )
    assert sorted(results, key=str) == [False] * (THREADS - 1) + [None]
    assert _audit(conn, account) == [("race", "feature_override_set", "sso", None, {"enabled": False})]


def test_an_override_of_an_account_that_does_not_exist_writes_nothing(
    conn: Conn, app: Conn, plans: Any
) -> None:
    with pytest.raises(UnknownAccount):
        features.set_override(app, plans, account_id="nobody", feature="sso", enabled=True, actor="adm")
    assert conn.execute("SELECT count(*) FROM audit_log").fetchone() == (0,)

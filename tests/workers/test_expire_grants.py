"""The hourly expire-grants task (credits): the expiry rows of grants past their time, once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.quota import grants
from service.vocabulary import GrantSource
from tests.conftest import PLANS_FILE
from tests.db.helpers import ledger_rows, new_account
from workers import tasks


def test_the_task_writes_each_expiry_row_once(
    db_url: str, conn: Any, plans: Any, monkeypatch: pytest.MonkeyPatch
):
    account = new_account(conn, plans)
    g = grants.create_grant(
        conn,
        plans,
        account_id=account,
        metric="urls",
        units=3,
        source=GrantSource.ADMIN,
        source_ref="soon",
        actor="admin",
        expires_at=datetime.now(UTC) - timedelta(seconds=1),
    )
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("PLANS_FILE", str(PLANS_FILE))
    assert tasks.expire_grants() == {"expired": 1}
    assert tasks.expire_grants() == {"expired": 0}
    rows = ledger_rows(conn, account, "urls", kind="grant_expire")
    assert [(r["units"], r["grant_id"], r["actor"]) for r in rows] == [(3, g.grant_id, grants.EXPIRY_ACTOR)]

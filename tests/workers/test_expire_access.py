"""The expire-access command: what the hourly task runs, against a real database."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from tests.conftest import PLANS_FILE


def test_expire_access_command_ends_what_ended_by_time(db_url: str, conn: Any) -> None:
    conn.execute(
        "INSERT INTO accounts (id, kind, plan, subscription_status) VALUES ('acc-1', 'user', 'pro', 'active')"
    )
    conn.execute(
        "INSERT INTO subscriptions (provider, subscription_id, account_id, plan, status, event_at, event_id,"
        " expires_at) VALUES ('revenuecat', 'APP_STORE:1', 'acc-1', 'pro', 'active', now() - interval '2 d',"
        " 'e1', now() - interval '1 d')"
    )
    env = {**os.environ, "DATABASE_URL": db_url, "PLANS_FILE": str(PLANS_FILE)}
    cmd = [sys.executable, "-m", "service.cli", "expire-access"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "ended 1 subscriptions of 1 accounts" in first.stdout
    assert conn.execute("SELECT plan, subscription_status FROM accounts").fetchone() == ("pro", "expired")
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert "ended 0 subscriptions" in again.stdout

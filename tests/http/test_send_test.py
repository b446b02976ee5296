"""`quota-ledger webhooks send-test` against a served app: the sample event that activates a paid
subscription changes the account's plan, through the real signature check; a wrong secret is a
clear refusal (exit 1) that says what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from service.keys import create_key
from tests.http.test_serve import ROOT, request, serve_env, serving

SECRET = "whsec_send_test"
AUTH = "Bearer send-test"


def send_test(
    port: int, provider: str, event: str, account: str, **env: str
) -> subprocess.CompletedProcess[str]:
    argv = ["webhooks", "send-test", provider, "--account", account, "--event", event]
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *argv, "--url", f"http://127.0.0.1:{port}"],
        cwd=ROOT,
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("STRIPE_WEBHOOK_SECRETS", "REVENUECAT_WEBHOOK_AUTH")
        }
        | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def plan(port: int, account: str, key: str) -> str:
    """The account's plan, or `lapsed` when its paid plan keeps no access (the tier stays as the
    provider last said; the limits fall back to the free plan's)."""
    status, body = request(port, "GET", f"/v1/accounts/{account}", key=key)
    assert status == 200, body
    account_ = json.loads(body)
    return (
        "lapsed" if account_["limits"]["urls"]["limit_source"] == "free_fallback" else str(account_["plan"])
    )


@pytest.mark.slow
def test_send_test_changes_the_plan_and_a_wrong_secret_says_what_to_do(app_db_url, redis_url, conn, tmp_path):
    key = create_key(conn, name="send-test", role="product")
    env = serve_env(app_db_url, redis_url, STRIPE_WEBHOOK_SECRETS=SECRET, REVENUECAT_WEBHOOK_AUTH=AUTH)
    with serving(env, "--workers", "1", log=tmp_path / "serve.log") as (port, _):
        for account in ("acc-stripe", "acc-rc"):
            assert request(port, "PUT", f"/v1/accounts/{account}", {"kind": "user"}, key)[0] == 201
            assert plan(port, account, key) == "free"

        wrong = send_test(
            port, "stripe", "customer.subscription.created", "acc-stripe", STRIPE_WEBHOOK_SECRETS="whsec_x"
        )
        assert wrong.returncode == 1 and "400" in wrong.stderr and "STRIPE_WEBHOOK_SECRETS" in wrong.stderr
        assert "quota-ledger dev" in wrong.stderr and "Traceback" not in wrong.stderr
        assert plan(port, "acc-stripe", key) == "free"
        unset = send_test(port, "stripe", "customer.subscription.created", "acc-stripe")
        assert unset.returncode == 2 and "STRIPE_WEBHOOK_SECRETS is not set" in unset.stderr

        sent = send_test(
            port, "stripe", "customer.subscription.created", "acc-stripe", STRIPE_WEBHOOK_SECRETS=SECRET
        )
        assert sent.returncode == 0, sent.stderr
        assert plan(port, "acc-stripe", key) == "pro"
        sent = send_test(
            port, "stripe", "customer.subscription.deleted", "acc-stripe", STRIPE_WEBHOOK_SECRETS=SECRET
        )
        assert sent.returncode == 0, sent.stderr
        assert plan(port, "acc-stripe", key) == "lapsed", sent.stdout

        sent = send_test(port, "revenuecat", "INITIAL_PURCHASE", "acc-rc", REVENUECAT_WEBHOOK_AUTH=AUTH)
        assert sent.returncode == 0, sent.stderr
        assert plan(port, "acc-rc", key) == "pro"
        sent = send_test(port, "revenuecat", "EXPIRATION", "acc-rc", REVENUECAT_WEBHOOK_AUTH=AUTH)
        assert sent.returncode == 0, sent.stderr
        assert plan(port, "acc-rc", key) == "lapsed"


def test_help_lists_the_events() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", "webhooks", "send-test", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert "customer.subscription.created" in out.stdout and "activates paid access" in out.stdout
    assert "INITIAL_PURCHASE" in out.stdout

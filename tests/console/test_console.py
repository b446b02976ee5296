"""The console without a browser: CSRF, escaping, the session's end (logout, idle, a revoked key),
the roles, and the console off without CONSOLE_SECRET_KEY."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import pytest

from service.config import Settings
from service.console import disabled_reason
from service.console.sessions import COOKIE
from service.keys import revoke_key
from tests.conftest import running_app
from tests.console.conftest import SECRET, csrf_of, sign_in
from tests.http.conftest import put_account, take


def signed_in(client: Any, keys: Any, role: str = "admin") -> str:
    r = sign_in(client, keys[role])
    assert r.status_code == 302 and r.location.endswith("/console/accounts"), r.get_data(as_text=True)
    cookie = client.get_cookie(COOKIE, path="/console")
    assert cookie is not None
    return str(cookie.value)


def override_of(client: Any, keys: Any, account: str = "acc-1") -> Any:
    return client.get(f"/v1/admin/accounts/{account}", headers=keys["admin"]).json["limits"]["urls"][
        "override"
    ]


def test_the_cookie_is_httponly_strict_and_secure_over_https(client, keys):
    r = sign_in(client, keys["admin"])
    header = r.headers["Set-Cookie"]
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/console" in header
    assert "Secure" not in header
    form = client.get("/console/login", base_url="https://console.test")
    token = csrf_of(form.get_data(as_text=True))
    key = keys["admin"]["Authorization"].removeprefix("Bearer ")
    r = client.post(
        "/console/login", data={"api_key": key, "csrf_token": token}, base_url="https://console.test"
    )
    assert r.status_code == 302 and "Secure" in r.headers["Set-Cookie"]


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(client, keys, account, conn):
    signed_in(client, keys)
    audit = conn.execute("SELECT count(*) FROM audit_log").fetchone()
    for data in ({"metric": "urls", "limit": "7"}, {"metric": "urls", "limit": "7", "csrf_token": "forged"}):
        r = client.post("/console/accounts/acc-1/override", data=data)
        assert r.status_code == 403 and "CSRF" in r.get_data(as_text=True)
    assert client.post("/console/accounts/acc-1/delete").status_code == 403
    assert override_of(client, keys) is None
    assert conn.execute("SELECT count(*) FROM audit_log").fetchone() == audit
    assert conn.execute("SELECT deleted FROM accounts WHERE id = 'acc-1'").fetchone() == (False,)
    # with the session's token it goes through
    token = csrf_of(client.get("/console/accounts/acc-1").get_data(as_text=True))
    r = client.post(
        "/console/accounts/acc-1/override", data={"metric": "urls", "limit": "7", "csrf_token": token}
    )
    assert r.status_code == 303
    assert override_of(client, keys) == {"limit": 7}


def test_login_without_its_token_is_refused(client, keys):
    key = keys["admin"]["Authorization"].removeprefix("Bearer ")
    assert client.post("/console/login", data={"api_key": key}).status_code == 403
    assert client.get_cookie(COOKIE, path="/console") is None


def test_product_and_wrong_keys_are_refused_on_the_page(client, keys):
    r = sign_in(client, keys["product"])
    assert r.status_code == 403 and "admin or finance key" in r.get_data(as_text=True)
    r = sign_in(client, {"Authorization": "Bearer qlk_not_a_key"})
    assert r.status_code == 401 and "Unknown, revoked or expired" in r.get_data(as_text=True)
    assert client.get_cookie(COOKIE, path="/console") is None
    assert client.get("/console/accounts").status_code == 302


def test_a_hostile_idempotency_key_is_shown_as_text(client, keys, account):
    take(client, keys, idempotency_key="<script>alert(1)</script>")
    signed_in(client, keys)
    r = client.get("/console/accounts/acc-1")
    html = r.get_data(as_text=True)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script" not in html
    csp = r.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "unsafe-inline" not in csp


def test_hostile_ids_and_payloads_are_escaped_everywhere(client, keys, conn):
    from tests.webhooks.helpers import post_stripe, stripe_subscription_event

    event = stripe_subscription_event(
        event_id="evt_<b>bold</b>", created=int(time.time()), account_id="<img src=x onerror=alert(1)>"
    )
    assert post_stripe(client, event).json["status"] == "unmatched"
    signed_in(client, keys)
    [(inbox_id,)] = conn.execute("SELECT id FROM webhook_events").fetchall()
    for path in ("/console/events", f"/console/events/{inbox_id}"):
        html = client.get(path).get_data(as_text=True)
        assert "<b>bold</b>" not in html and "<img" not in html, path
        assert "&lt;b&gt;bold&lt;/b&gt;" in html, path
    r = client.get("/console/accounts?q=%3Cscript%3E")
    assert r.status_code == 200 and "<script>" not in r.get_data(as_text=True)


def test_logout_ends_the_session_and_the_old_cookie_no_longer_works(client, keys):
    old = signed_in(client, keys)
    assert client.get("/console/accounts").status_code == 200
    token = csrf_of(client.get("/console/accounts").get_data(as_text=True))
    assert client.post("/console/logout", data={"csrf_token": token}).status_code == 302
    client.set_cookie(COOKIE, old, path="/console")
    r = client.get("/console/accounts")
    assert r.status_code == 302 and "/console/login" in r.location
    # the old cookie and its token change nothing either
    client.set_cookie(COOKIE, old, path="/console")
    r = client.post("/console/accounts/acc-1/delete", data={"csrf_token": token})
    assert r.status_code == 403 and "not signed in" in r.get_data(as_text=True)


def test_signing_in_again_ends_the_session_the_browser_held(client, keys):
    first = signed_in(client, keys)
    second = signed_in(client, keys, "finance")
    assert second != first
    client.set_cookie(COOKIE, first, path="/console")
    r = client.get("/console/accounts")
    assert r.status_code == 302 and "/console/login" in r.location


def test_a_revoked_key_ends_its_session(client, keys, conn):
    signed_in(client, keys)  # key_cache_seconds is 0 in the tests: the next request checks the key
    assert client.get("/console/accounts").status_code == 200
    revoke_key(conn, name="test-admin")
    r = client.get("/console/accounts")
    assert r.status_code == 302 and "why=revoked" in r.location
    assert client.get("/console/login?why=revoked").status_code == 200


def test_a_revoked_key_ends_its_session_within_the_key_cache_time(console_settings, keys, conn):
    with running_app(dataclasses.replace(console_settings, key_cache_seconds=1.0)) as app:
        client = app.test_client()
        signed_in(client, keys)
        revoke_key(conn, name="test-admin")
        assert client.get("/console/accounts").status_code == 200  # the cached key, for at most 1 s
        time.sleep(1.2)
        r = client.get("/console/accounts")
        assert r.status_code == 302 and "why=revoked" in r.location


def test_an_idle_session_ends(console_settings, keys):
    with running_app(dataclasses.replace(console_settings, console_idle_minutes=1 / 60)) as app:
        client = app.test_client()
        signed_in(client, keys)
        assert client.get("/console/accounts").status_code == 200
        time.sleep(2.2)
        assert client.get("/console/accounts").status_code == 302


def test_finance_reads_but_its_posts_are_refused(client, keys, account, conn):
    signed_in(client, keys, "finance")
    html = client.get("/console/accounts/acc-1").get_data(as_text=True)
    assert 'id="override-form"' not in html and 'method="post" action="/console/accounts' not in html
    token = csrf_of(html)  # the sign-out form's: finance's own valid token
    for path, data in (
        ("/console/accounts/acc-1/override", {"metric": "urls", "limit": "9"}),
        ("/console/accounts/acc-1/reset", {"metric": "urls"}),
        ("/console/accounts/acc-1/delete", {}),
        ("/console/events/1/replay", {}),
    ):
        r = client.post(path, data={**data, "csrf_token": token})
        assert r.status_code == 403 and "only an admin" in r.get_data(as_text=True), path
    assert override_of(client, keys) is None
    assert conn.execute("SELECT deleted FROM accounts WHERE id = 'acc-1'").fetchone() == (False,)
    for page in ("/console/ledger", "/console/events", "/console/audit", "/console/accounts"):
        assert client.get(page).status_code == 200, page


def test_a_refusal_of_the_domain_is_a_page_with_its_status(client, keys, account):
    signed_in(client, keys)
    token = csrf_of(client.get("/console/accounts/acc-1").get_data(as_text=True))
    r = client.post("/console/accounts/acc-1/reset", data={"metric": "seats", "csrf_token": token})
    assert r.status_code == 409 and "text/html" in r.content_type
    r = client.post(
        "/console/accounts/acc-1/override", data={"metric": "urls", "limit": "-1", "csrf_token": token}
    )
    assert r.status_code == 422
    assert client.get("/console/accounts/ghost").status_code == 404
    assert client.get("/console/ledger?period=nope").status_code == 422
    assert client.get("/console/events?status=bogus").status_code == 422
    assert client.get("/console/events?status=unmatched&provider=").status_code == 200


@pytest.mark.parametrize("secret", ["", "x" * 31])
def test_without_a_secret_key_the_console_is_off(settings: Settings, keys, secret):
    off = dataclasses.replace(settings, console_secret_key=secret)
    assert disabled_reason(off) is not None and "CONSOLE_SECRET_KEY" in str(disabled_reason(off))
    with running_app(off) as app:
        client = app.test_client()
        for path in ("/console", "/console/login", "/console/accounts", "/console/static/console.css"):
            assert client.get(path).status_code == 404, path
        assert client.get("/v1/accounts/acc-1", headers=keys["product"]).status_code == 404  # the API is on
    assert disabled_reason(dataclasses.replace(settings, console_secret_key=SECRET)) is None


def test_serve_says_why_the_console_is_off_in_one_line(monkeypatch, capsys):
    from service.serve import console_off

    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    monkeypatch.delenv("CONSOLE_SECRET_KEY", raising=False)
    console_off()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CONSOLE_SECRET_KEY is not set" in err
    monkeypatch.setenv("CONSOLE_SECRET_KEY", SECRET)
    console_off()
    assert capsys.readouterr().err == ""


def test_the_pages_answer(client, keys, account):
    put_account(client, keys, "acc-2", stripe_customer_id="cus_find_me")
    take(client, keys, units=3)
    signed_in(client, keys)
    found = client.get("/console/accounts?q=cus_find_me&by=customer").get_data(as_text=True)
    assert "acc-2" in found and "acc-1" not in found.split("<tbody>")[1]
    by_plan = client.get("/console/accounts?q=free&by=plan").get_data(as_text=True)
    assert "acc-1" in by_plan and "acc-2" in by_plan
    ledger = client.get("/console/ledger?verify=1").get_data(as_text=True)
    assert "agree with their ledger rows" in ledger and "no break" in ledger
    csv = client.get("/console/ledger.csv")
    assert csv.status_code == 200 and csv.mimetype == "text/csv"
    csv.close()
    assert "key_created" in client.get("/console/audit").get_data(as_text=True)


def test_hostile_search_and_form_values_are_refusals_not_errors(client, keys, account):
    """A NUL in a search (PostgreSQL text refuses it) finds nothing; a limit in other Unicode digits
    ("²" is a digit to isdigit, and not to int; full-width ones are to both) is refused, not read."""
    signed_in(client, keys)
    for query in ("q=%00&by=id", "q=a%00b&by=customer", "q=%00&by=plan", "after=%00"):
        r = client.get(f"/console/accounts?{query}")
        assert r.status_code == 200, (query, r.status_code)
    token = csrf_of(client.get("/console/accounts/acc-1").get_data(as_text=True))
    for limit in ("\u00b2", "\uff11\uff12", "7x"):
        r = client.post(
            "/console/accounts/acc-1/override", data={"metric": "urls", "limit": limit, "csrf_token": token}
        )
        assert r.status_code == 422, (limit, r.status_code)
    assert override_of(client, keys) is None


def test_an_admin_grants_credits_once_per_form_and_voids_them_finance_cannot(client, keys, account, conn):
    """The grant form: the API's rules (a consumable metric, units >= 1), its own idempotency key
    (the same form sent twice grants once), the credits on the page and in the API; void forward-only."""
    signed_in(client, keys)
    page = client.get("/console/accounts/acc-1").get_data(as_text=True)
    token = csrf_of(page)
    key = re.search(r'name="idempotency_key" value="([^"]+)"', page)
    assert key is not None
    form = {
        "metric": "urls",
        "units": "5",
        "note": "<b>goodwill</b>",
        "csrf_token": token,
        "idempotency_key": key[1],
    }
    for _ in range(2):  # a double submit
        assert client.post("/console/accounts/acc-1/grant", data=form).status_code == 303
    listed = client.get("/v1/accounts/acc-1/grants", headers=keys["product"]).json["grants"]
    assert [(g["metric"], g["units"], g["remaining"]) for g in listed] == [("urls", 5, 5)]
    page = client.get("/console/accounts/acc-1").get_data(as_text=True)
    assert 'data-credits="5"' in page and "&lt;b&gt;goodwill&lt;/b&gt;" in page
    for bad in (
        {"metric": "seats", "units": "1"},
        {"metric": "urls", "units": "0"},
        {"metric": "urls", "units": "²"},
    ):
        r = client.post(
            "/console/accounts/acc-1/grant", data={**bad, "csrf_token": token, "idempotency_key": "k2"}
        )
        assert r.status_code == 422, bad
    grant_id = listed[0]["grant_id"]
    finance = client.application.test_client()
    signed_in(finance, keys, "finance")
    ftoken = csrf_of(finance.get("/console/accounts/acc-1").get_data(as_text=True))
    assert (
        finance.post(
            f"/console/accounts/acc-1/grants/{grant_id}/void", data={"csrf_token": ftoken}
        ).status_code
        == 403
    )
    assert (
        finance.post("/console/accounts/acc-1/grant", data={**form, "csrf_token": ftoken}).status_code == 403
    )
    assert (
        client.post(f"/console/accounts/acc-1/grants/{grant_id}/void", data={"csrf_token": token}).status_code
        == 303
    )
    listed = client.get("/v1/accounts/acc-1/grants", headers=keys["product"]).json["grants"]
    assert (listed[0]["status"], listed[0]["remaining"]) == ("voided", 0)
    assert client.post("/console/accounts/other/grants/1/void", data={"csrf_token": token}).status_code == 404


def test_the_grant_form_reads_its_expiry_as_utc(client, keys, account):
    """The form's datetime-local has no offset: it is read as UTC, as the page says."""
    signed_in(client, keys)
    token = csrf_of(client.get("/console/accounts/acc-1").get_data(as_text=True))
    form = {"metric": "urls", "units": "2", "expires_at": "2099-01-02T03:04", "idempotency_key": "exp-1"}
    assert client.post("/console/accounts/acc-1/grant", data={**form, "csrf_token": token}).status_code == 303
    [grant] = client.get("/v1/accounts/acc-1/grants", headers=keys["product"]).json["grants"]
    assert (grant["units"], grant["expires_at"]) == (2, "2099-01-02T03:04:00+00:00")

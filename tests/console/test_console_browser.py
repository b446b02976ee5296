"""The console in a real headless Chromium (Debian's chromium and chromedriver; skipped without
them): admin and finance sign in, read an account whose plot must match the ledger's daily sums,
an admin sets an override that the API then shows, finance is refused the same form, the CSV
downloads, and an unmatched provider event is replayed. With QL_TEST_SCREENSHOT_DIR set, the account
page is saved there as console-account.png (docs/img/ holds the committed one)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import make_server

from tests.console.conftest import csrf_of
from tests.http.conftest import put_account, take
from tests.http.test_index import SCREENSHOT, chromium
from tests.webhooks.helpers import CUSTOMER, STRIPE_ACCOUNT, fixture, post_stripe, stripe_subscription_event


@pytest.fixture
def served(app: Any) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, app, threaded=True)
    import threading

    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def key_of(header: dict[str, str]) -> str:
    return header["Authorization"].removeprefix("Bearer ")


def click_through(driver: Any, element: Any) -> None:
    """Click what loads another page, and wait until it has: a click returns before the browser has
    left the page, and a look straight after it may read the old one (it did, once, on a busy CI)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    element.click()

    def left(_: Any) -> bool:
        # selenium's staleness_of, plus the way Chromium says it mid-navigation: asked about a node
        # of the page being replaced, it answers "does not belong to the document", not "stale"
        try:
            old.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as e:
            if "does not belong to the document" in str(e):
                return True
            raise
        return False

    WebDriverWait(driver, 20).until(left)


def sign_in(driver: Any, base: str, key: str) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(base + "/console/login")
    driver.find_element(By.ID, "api_key").send_keys(key)
    click_through(driver, driver.find_element(By.CSS_SELECTOR, "form button[type=submit]"))
    assert driver.current_url.endswith("/console/accounts"), driver.page_source[:2000]


def daily_sums(conn: Any, account: str, metric: str) -> dict[str, tuple[int, int]]:
    """The ledger's own daily sums of takes and releases (UTC days), straight from SQL."""
    rows = conn.execute(
        "SELECT (at AT TIME ZONE 'UTC')::date::text,"
        " coalesce(sum(units) FILTER (WHERE kind = 'take'), 0),"
        " coalesce(sum(units) FILTER (WHERE kind = 'release'), 0)"
        " FROM ledger WHERE account_id = %s AND metric = %s GROUP BY 1",
        (account, metric),
    ).fetchall()
    return {day: (int(t), int(r)) for day, t, r in rows}


def test_the_console_in_a_browser(served: str, client: Any, keys: Any, conn: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    # The account: on pro by its Stripe subscription, with usage of each kind of metric.
    account = STRIPE_ACCOUNT
    put_account(client, keys, account, stripe_customer_id=CUSTOMER)
    assert post_stripe(client, fixture("stripe", "customer.subscription.updated")).json["status"] == "applied"
    # An event for an account that does not exist yet: stored unmatched.
    later = stripe_subscription_event(
        event_id="evt_console_later",
        created=int(time.time()),
        account_id="acc-later",
        sub_id="sub_later",
        customer="cus_later",
    )
    unmatched = post_stripe(client, later)
    assert unmatched.json["status"] == "unmatched"
    for units, key in ((40, "order-1001"), (25, "<script>alert(1)</script>"), (15, None)):
        take(client, keys, account, units=units, idempotency_key=key)
    first = take(client, keys, account, metric="seats", units=2)
    client.post(f"/v1/accounts/{account}/takes/{first['take_id']}/release", headers=keys["product"])
    take(client, keys, account, metric="seats", units=1)
    take(client, keys, account, metric="exports", units=12)
    take(client, keys, account, metric="api_calls", units=300)
    granted = client.post(
        f"/v1/admin/accounts/{account}/grants",
        json={"metric": "urls", "units": 50, "note": "goodwill", "idempotency_key": "g-1"},
        headers=keys["admin"],
    )
    assert granted.status_code == 201, granted.json  # the page shows it: credits and the grants table

    driver = chromium()
    try:
        driver.set_window_size(1280, 1700)
        # --- admin
        sign_in(driver, served, key_of(keys["admin"]))
        driver.get(f"{served}/console/accounts?q=acc_7/console/accounts?q=acc-&by=idby=id")
        assert account in driver.find_element(By.TAG_NAME, "table").text
        driver.get(f"{served}/console/accounts/{account}")
        assert not driver.find_elements(By.CSS_SELECTOR, "script"), "the page has no script at all"
        # the hostile key is text on the page, not markup
        assert "<script>alert(1)</script>" in driver.find_element(By.CSS_SELECTOR, "table.ledger").text
        # each plot: an SVG image named for its metric, whose points are the ledger's daily sums
        for metric in ("urls", "seats", "exports"):
            svg = driver.find_element(By.CSS_SELECTOR, f'svg.plot[data-metric="{metric}"]')
            assert svg.get_attribute("role") == "img" and metric in svg.get_attribute("aria-label")
            sums = daily_sums(conn, account, metric)
            points = svg.find_elements(By.CSS_SELECTOR, "circle")
            assert points, metric
            for p in points:
                day = p.get_attribute("data-date")
                taken, released = sums.get(day, (0, 0))
                assert (int(p.get_attribute("data-taken")), int(p.get_attribute("data-released"))) == (
                    taken,
                    released,
                ), (metric, day)
            assert sum(int(p.get_attribute("data-taken")) for p in points) == sum(t for t, _ in sums.values())
        used_today = driver.find_elements(By.CSS_SELECTOR, 'svg.plot[data-metric="urls"] circle')[-1]
        assert used_today.get_attribute("data-used") == "80"

        # an override, set in the form: the page and the API both show it
        form = driver.find_element(By.ID, "override-form")
        form.find_element(By.NAME, "metric").send_keys("urls")
        form.find_element(By.NAME, "limit").send_keys("1234")
        click_through(driver, form.find_element(By.CSS_SELECTOR, 'button[value="set"]'))
        assert "Override saved." in driver.find_element(By.CSS_SELECTOR, ".done").text
        card = driver.find_element(By.ID, "metric-urls")
        assert "1,234" in card.text and "override" in card.text and "80" in card.text
        api = client.get(f"/v1/admin/accounts/{account}", headers=keys["admin"]).json
        urls = api["limits"]["urls"]
        assert (urls["limit"], urls["limit_source"]) == (1234, "override")
        if SCREENSHOT is not None:
            driver.get(f"{served}/console/accounts/{account}")
            driver.save_screenshot(str(SCREENSHOT / "console-account.png"))

        # replay the unmatched event: still unmatched (its account does not exist), tried twice
        driver.get(f"{served}/console/events?status=unmatched")
        click_through(driver, driver.find_element(By.LINK_TEXT, str(unmatched.json["id"])))
        assert "evt_console_later" in driver.find_element(By.CSS_SELECTOR, "pre.payload").text
        click_through(driver, driver.find_element(By.CSS_SELECTOR, "#replay-form button"))
        assert "Replayed" in driver.find_element(By.CSS_SELECTOR, ".done").text
        assert conn.execute(
            "SELECT status, attempts FROM webhook_events WHERE id = %s", (unmatched.json["id"],)
        ).fetchone() == ("unmatched", 2)
        put_account(client, keys, "acc-later")  # the link applies it
        driver.get(f"{served}/console/accounts/acc-later")
        main = driver.find_element(By.TAG_NAME, "main").text
        assert "It follows stripe subscription sub_later" in main and "evt_console_later" in main

        # --- finance: reads everything, sees no form, and the same POST is refused
        admin_csrf = csrf_of(driver.page_source)
        sign_in(driver, served, key_of(keys["finance"]))
        driver.get(f"{served}/console/accounts/{account}")
        assert not driver.find_elements(By.ID, "override-form")
        assert not driver.find_elements(By.CSS_SELECTOR, "main form[method=post]")
        # the admin's form, posted from finance's session with finance's own token: 403, nothing changes
        finance_csrf = csrf_of(driver.page_source)
        assert finance_csrf != admin_csrf
        posted = _post_from_page(
            driver,
            f"/console/accounts/{account}/override",
            {"metric": "urls", "limit": "1", "csrf_token": finance_csrf},
        )
        assert "403" in posted and "only an admin" in posted
        api = client.get(f"/v1/admin/accounts/{account}", headers=keys["admin"]).json
        assert api["limits"]["urls"]["limit"] == 1234

        # the CSV, downloaded by the browser
        driver.execute_cdp_cmd(
            "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)}
        )
        driver.get(f"{served}/console/ledger")
        assert "agree with their ledger rows" in driver.find_element(By.ID, "reconciliation").text
        driver.find_element(By.LINK_TEXT, "Download CSV").click()
        deadline = time.monotonic() + 20
        while not list(tmp_path.glob("ledger-*.csv")) and time.monotonic() < deadline:
            time.sleep(0.2)
        [csv] = list(tmp_path.glob("ledger-*.csv"))
        text = csv.read_text()
        assert text.splitlines()[0].startswith("id,") and "order-1001" in text
    finally:
        driver.quit()


def _post_from_page(driver: Any, path: str, fields: dict[str, str]) -> str:
    """POST a form built in the DOM (no script runs from the page itself: the test drives it), and
    the text of the page that answers."""
    from selenium.webdriver.common.by import By

    driver.execute_script(
        "const f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];"
        "for (const [k, v] of Object.entries(arguments[1])) {"
        " const i = document.createElement('input'); i.type = 'hidden'; i.name = k; i.value = v;"
        " f.appendChild(i); }"
        "document.body.appendChild(f); f.submit();",
        path,
        fields,
    )
    time.sleep(0.5)
    return str(driver.find_element(By.TAG_NAME, "body").text)

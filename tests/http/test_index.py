"""`GET /` is a JSON index whose links all answer, and `GET /docs` is the API reference rendered from
/openapi.json in a real headless Chromium, from files the service serves itself (no CDN)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import make_server

SCREENSHOT = (
    Path(os.environ.get("QL_TEST_SCREENSHOT_DIR", "")) if os.environ.get("QL_TEST_SCREENSHOT_DIR") else None
)


def test_the_root_is_an_index_whose_links_answer(client):
    r = client.get("/")
    assert r.status_code == 200 and r.is_json, r.data
    body = r.get_json()
    assert body["service"] == "quota-ledger" and body["version"]
    assert set(body["links"]) == {"openapi", "docs", "healthz", "readyz", "metrics"}
    for name, href in body["links"].items():
        assert client.get(href).status_code == 200, (name, href)


def test_the_reference_page_and_its_files_are_served_by_the_app(client):
    page = client.get("/docs")
    assert page.status_code == 200 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    assert "//" not in html.replace("<!doctype html>", ""), "no address outside the service (no CDN)"
    for path, mimetype in (
        ("/docs/swagger-ui.css", "text/css"),
        ("/docs/swagger-ui-bundle.js", "text/javascript"),
    ):
        assert f'"{path}"' in html
        r = client.get(path)
        assert r.status_code == 200 and r.mimetype == mimetype and len(r.data) > 10_000, path
        r.close()


@pytest.fixture
def served(app: Any) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def chromium() -> Any:
    try:
        from selenium import webdriver
    except ImportError:
        pytest.skip("selenium is not installed (the test extra pins it)")
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (browser and driver):
        pytest.skip("no chromium or chromedriver (Debian: apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1400"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


def test_the_reference_page_renders_every_operation_in_a_browser(served, app):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    with app.test_client() as c:
        doc = c.get("/openapi.json").get_json()
    operations = sum(
        len([m for m in ops if m in {"get", "put", "post", "patch", "delete"}])
        for ops in doc["paths"].values()
    )
    driver = chromium()
    try:
        driver.get(served + "/docs")
        WebDriverWait(driver, 30).until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".opblock-summary-path"))
        )
        assert doc["info"]["title"] in driver.find_element(By.CSS_SELECTOR, ".info .title").text
        shown = driver.find_elements(By.CSS_SELECTOR, ".opblock")
        assert len(shown) == operations, (len(shown), operations)
        assert not driver.find_elements(By.CSS_SELECTOR, ".errors-wrapper"), "Swagger UI reports errors"
        if SCREENSHOT is not None:
            driver.save_screenshot(str(SCREENSHOT / "api-reference.png"))
    finally:
        driver.quit()

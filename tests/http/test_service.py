"""Unauthenticated endpoints (/healthz, /readyz, /metrics, /openapi.json) and routing errors."""

from __future__ import annotations

import re

from service.config import Settings
from tests.http.conftest import assert_error, take


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json == {"status": "ok"}


def test_readyz_checks_database_and_broker(client):
    r = client.get("/readyz")
    assert r.status_code == 200, r.json
    assert r.json == {"status": "ready", "checks": {"database": "ok", "broker": "ok"}}


def test_readyz_stays_ready_when_the_broker_is_down(db_url):
    """The web tier serves without Redis: the broker is reported, not a reason to leave rotation."""
    from service import create_app

    app = create_app(Settings(database_url=db_url, redis_url="redis://127.0.0.1:1/0"))
    try:
        r = app.test_client().get("/readyz")
    finally:
        app.extensions["quota"].pool.close()
    assert r.status_code == 200, r.json
    assert r.json["status"] == "ready"
    assert r.json["checks"]["database"] == "ok" and r.json["checks"]["broker"].startswith("error")


def _sample(text, name, labels):
    pattern = re.escape(name) + r"\{" + re.escape(labels) + r"\} ([0-9.e+]+)"
    m = re.search(pattern, text)
    return float(m.group(1)) if m else 0.0


def test_metrics_count_takes_by_outcome(client, keys, account, conn):
    from tests.db.helpers import set_override

    before = client.get("/metrics").get_data(as_text=True)
    set_override(conn, account, "urls", 1)
    take(client, keys)
    client.post(f"/v1/accounts/{account}/takes", json={"metric": "urls"}, headers=keys["product"])

    r = client.get("/metrics")
    assert r.status_code == 200 and r.mimetype == "text/plain"
    text = r.get_data(as_text=True)
    assert "quota_takes_total" in text
    outcome = 'outcome="granted"'
    assert _sample(text, "quota_takes_total", outcome) == _sample(before, "quota_takes_total", outcome) + 1
    outcome = 'outcome="quota_exhausted"'
    assert _sample(text, "quota_takes_total", outcome) == _sample(before, "quota_takes_total", outcome) + 1
    assert "http_request_duration_seconds_bucket" in text


def _flask_to_openapi(rule):
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule)


def test_openapi_documents_every_v1_route(app, client):
    r = client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json
    assert doc["openapi"].startswith("3.")
    routes = {
        (_flask_to_openapi(rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith("/v1/")
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    documented = {
        (path, method) for path, ops in doc["paths"].items() for method in ops if method != "parameters"
    }
    assert routes - documented == set()
    take_op = doc["paths"]["/v1/accounts/{id}/takes"]["post"]
    schema = take_op["requestBody"]["content"]["application/json"]["schema"]
    assert "TakeRequest" in str(schema)
    assert {"201", "200", "401", "403", "404", "409", "410", "422"} <= set(take_op["responses"])


def test_routing_404_and_405_have_json_bodies(client, keys):
    assert_error(client.get("/nope"), 404, "not_found")
    assert_error(client.get("/v1/nope", headers=keys["product"]), 404)
    r = client.delete("/v1/accounts/acc-1/takes", headers=keys["product"])
    assert_error(r, 405, "method_not_allowed")
    assert "POST" in r.headers["Allow"]
    assert_error(client.get("/v1/takes/1/release", headers=keys["product"]), 405)


def test_oversized_body_is_413_with_a_json_body(client, keys):
    r = client.post("/v1/accounts/acc-1/takes", data=b"x" * (1024 * 1024 + 1), headers=keys["product"])
    assert_error(r, 413)

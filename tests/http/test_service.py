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
    assert r.json == {
        "status": "ready",
        "checks": {"database": "ok", "broker": "ok", "exports": "0 of 2 running (informational)"},
    }


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


def _series(client):
    """The label sets of the request-latency histogram, as /metrics shows them."""
    text = client.get("/metrics").get_data(as_text=True)
    return set(re.findall(r"^http_request_duration_seconds_count\{(.*)\}", text, re.M))


def test_made_up_methods_and_paths_do_not_grow_the_metrics(client, keys):
    client.open("/v1/made-up", method="BREW", headers=keys["product"])
    client.get("/v1/made-up/0", headers=keys["product"])
    _series(client)  # /metrics itself is a route with its own series
    before = _series(client)
    for i in range(50):
        client.open(f"/v1/x{i}/{i}", method=f"M{i}", headers=keys["product"])
        client.open(f"/v1/accounts/acc/{i}", method=f"N{i}", headers=keys["product"])
        client.get(f"/nowhere/{i}")
    after = _series(client)
    assert after == before
    assert not any(f'"M{i}"' in s or f"x{i}" in s for s in after for i in range(50))


def test_a_matched_route_is_labelled_by_its_rule_not_its_path(client, keys, account):
    take(client, keys)
    series = _series(client)
    assert any('route="/v1/accounts/<id>/takes"' in s and 'method="POST"' in s for s in series)
    assert not any("acc-1" in s for s in series)


def _flask_to_openapi(rule):
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule)


def test_openapi_documents_every_route(app, client):
    r = client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json
    assert doc["openapi"].startswith("3.")
    routes = {
        (_flask_to_openapi(rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static"
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    documented = {
        (path, method) for path, ops in doc["paths"].items() for method in ops if method != "parameters"
    }
    assert routes == documented
    take_op = doc["paths"]["/v1/accounts/{id}/takes"]["post"]
    schema = take_op["requestBody"]["content"]["application/json"]["schema"]
    assert "TakeRequest" in str(schema)
    assert {"201", "200", "401", "403", "404", "409", "410", "422"} <= set(take_op["responses"])
    assert doc["paths"]["/v1/ledger.csv"]["get"]["responses"]["200"]["content"].keys() == {"text/csv"}
    usage = doc["paths"]["/v1/accounts/{id}/usage"]
    assert {p["name"]: p["in"] for p in usage["get"]["parameters"]} == {"metric": "query", "period": "query"}
    assert usage["get"]["parameters"][0]["schema"]["enum"] == ["api_calls", "exports", "seats", "urls"]
    assert usage["parameters"][0]["schema"]["pattern"] == "^[A-Za-z0-9._:@-]{1,128}$"
    assert doc["paths"]["/webhooks/revenuecat"]["post"]["security"] == [{"revenuecatAuthorization": []}]


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

"""Whatever a client sends, the answer is a 4xx with the JSON error body (or a success), never a 5xx;
nothing it sends grows the metrics without bound."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.serving import make_server

from tests.db.helpers import counter, ledger_rows
from tests.http.conftest import assert_error, take

LIMIT = 1024 * 1024  # the app's MAX_CONTENT_LENGTH


DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000


@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT], ids=["array", "object"])
def test_json_nested_100000_deep_is_a_4xx(client, keys, account, conn, body):
    r = client.post(f"/v1/accounts/{account}/takes", data=body, headers=keys["product"])
    assert_error(r, 400, "invalid_json")
    assert ledger_rows(conn, account) == []


ITEM = {"account_id": "acc-1", "metric": "urls"}
LINE = {"metric": "urls"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/takes/batch", {"items": [ITEM] * 10_000}),
        ("/v1/takes/batch", {"items": [ITEM, {**ITEM, "units": 2**63}]}),
        ("/v1/takes/batch", {"items": [[ITEM]]}),
        ("/v1/takes/batch", {"items": [{"items": [ITEM]}]}),
        ("/v1/takes/batch", {"items": []}),
        ("/v1/accounts/acc-1/takes", {"lines": [{"lines": [LINE]}]}),
        ("/v1/accounts/acc-1/takes", {"lines": [LINE, [LINE]]}),
        ("/v1/accounts/acc-1/takes", {"lines": [LINE, LINE]}),
        ("/v1/accounts/acc-1/takes", {"lines": [{"metric": "urls", "units": 10**30}]}),
        ("/v1/accounts/acc-1/takes", {"lines": []}),
        ("/v1/accounts/acc-1/takes", {"lines": [LINE] * 10_000}),
        ("/v1/accounts/acc-1/takes", {"lines": [LINE], "metric": "urls"}),
    ],
    ids=[
        "10000 items", "huge units in an item", "an item a list", "nested items", "0 items", "nested lines",
        "a line a list", "duplicate metrics", "huge units in a line", "0 lines", "10000 lines",
        "metric and lines",
    ],
)  # fmt: skip
def test_a_hostile_bulk_body_is_a_4xx_and_changes_nothing(client, keys, account, conn, path, body):
    """A batch's or a multi-line take's body the schema refuses takes nothing, not even its good
    parts (a batch's items are refused one by one only once the body's shape is right)."""
    r = client.post(path, json=body, headers=keys["product"])
    if r.status_code == 200:  # a batch of the right shape: each bad item refused on its own
        statuses = [item["status"] for item in r.json["results"]]
        assert statuses[-1] == 422 and set(statuses) <= {201, 422}, r.json
        assert counter(conn, account, "urls")["used"] == statuses.count(201)
        return
    assert 400 <= r.status_code < 500, r.get_data(as_text=True)[:300]
    assert_error(r, r.status_code)
    assert ledger_rows(conn, account) == []


def test_non_ascii_digits_are_not_ids(client, keys, account, conn):
    t = take(client, keys)
    assert t["take_id"] == 1
    for path in ("/v1/takes/%D9%A1/release", "/v1/takes/%C2%B9/release", "/v1/takes/%EF%BC%91/release"):
        assert_error(client.post(path, headers=keys["product"]), 404)
    assert counter(conn, account, "urls")["used"] == 1
    for path in ("/v1/admin/events/%C2%B2/replay", "/v1/admin/events/%D9%A1/replay"):
        assert_error(client.post(path, headers=keys["admin"]), 404, "unknown_event")


def test_an_unknown_stored_event_is_404_unknown_event(client, keys):
    assert_error(client.post("/v1/admin/events/12345/replay", headers=keys["admin"]), 404, "unknown_event")
    assert_error(client.post(f"/v1/admin/events/{10**30}/replay", headers=keys["admin"]), 404)


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/v1/ledger", {"cursor": "5\n"}),
        ("/v1/audit", {"cursor": "5\n"}),
        ("/v1/ledger", {"period": "2026-01\n"}),
        ("/v1/ledger", {"account_id": "acc\n"}),
        ("/v1/reconciliation", {"period": "2026-01\n"}),
    ],
)
def test_a_trailing_newline_is_not_valid(client, keys, path, query):
    assert_error(client.get(path, query_string=query, headers=keys["finance"]), 422, "validation_failed")


def test_an_account_id_with_a_trailing_newline_is_refused(client, keys):
    assert_error(client.get("/v1/accounts/acc%0A", headers=keys["product"]), 422, "validation_failed")


@pytest.mark.parametrize("path", ["/v1//accounts/acc-1", "//v1/accounts/acc-1", "/v1/accounts//acc-1"])
def test_a_double_slash_is_a_404_not_a_redirect_to_the_host_header(client, keys, account, path):
    r = client.get(path, headers={**keys["product"], "Host": "evil.example"})
    assert_error(r, 404)
    assert "Location" not in r.headers


def test_a_body_left_unread_closes_the_connection_and_says_so(client, keys, account):
    refused = client.post(f"/v1/accounts/{account}/takes", data=b" " * (LIMIT + 1), headers=keys["product"])
    assert_error(refused, 413)
    assert refused.headers["Connection"] == "close"
    # A body is read whole before any view runs, so an answer given before a view would read it
    # (401) leaves nothing on the connection: it stays open.
    early = client.post(f"/v1/accounts/{account}/takes", json={"metric": "urls"})
    assert_error(early, 401)
    assert "Connection" not in early.headers
    read = client.post(f"/v1/accounts/{account}/takes", json={"metric": "urls"}, headers=keys["product"])
    assert read.status_code == 201 and "Connection" not in read.headers
    # Over the limit is 413 on any route, before auth, even one whose view reads no body.
    for method, path in (("GET", "/healthz"), ("POST", "/v1/takes/1/release")):
        big = client.open(path, method=method, data=b" " * (LIMIT + 1))
        assert_error(big, 413)
        assert big.headers["Connection"] == "close"


def test_a_chunked_body_overrides_a_content_length(client, keys, account):
    """Transfer-Encoding: chunked wins over a Content-Length sent with it (RFC 9112 6.3), as werkzeug
    reads it: the body is the de-chunked stream, not the Content-Length's first bytes."""
    body = json.dumps({"metric": "urls", "idempotency_key": "k" * 60}).encode()
    r = client.post(
        f"/v1/accounts/{account}/takes",
        data=body,
        headers={**keys["product"], "Content-Type": "application/json"},
        # as a server passes such a request on: both headers, the stream de-chunked and ended
        environ_overrides={
            "CONTENT_LENGTH": "5",
            "HTTP_TRANSFER_ENCODING": "chunked",
            "wsgi.input_terminated": True,
        },
    )
    assert r.status_code == 201, r.get_json()  # its first 5 bytes alone would be 400, not JSON
    again = client.post(f"/v1/accounts/{account}/takes", data=body, headers=keys["product"])
    assert again.status_code == 200  # the key was read too: the same take, replayed


@pytest.fixture
def server(app: Any) -> Iterator[tuple[str, int]]:
    """The app behind werkzeug's own HTTP server, which de-chunks request bodies."""
    srv = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", srv.server_port
    finally:
        srv.shutdown()
        thread.join()


def _chunked(server: tuple[str, int], path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    c = http.client.HTTPConnection(*server, timeout=30)
    try:
        c.request(
            "POST",
            path,
            body=iter([body[i : i + 65536] for i in range(0, len(body), 65536)]),
            headers={**headers, "Content-Type": "application/json"},
            encode_chunked=True,
        )
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def _refused_takes(client: Any) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    series = 'http_request_duration_seconds_count{method="POST",route="/v1/accounts/<id>/takes",status="413"}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series))


def test_a_chunked_body_over_the_limit_over_http_is_413(server, client, keys, account, conn):
    before = _refused_takes(client)
    body = json.dumps({"metric": "urls"}).encode() + b" " * LIMIT
    status, answer = _chunked(server, f"/v1/accounts/{account}/takes", body, keys["product"])
    assert (status, answer["error"]) == (413, "request_entity_too_large")
    assert ledger_rows(conn, account) == []
    assert _refused_takes(client) == before + 1  # timed and counted like any answer
    status, answer = _chunked(server, f"/v1/accounts/{account}/takes", b'{"metric": "urls"}', keys["product"])
    assert status == 201, answer


# Every route of the app, the role it wants, and its path parameters as generated text.
ROUTES = [
    ("PUT", "/v1/accounts/{id}", "product"),
    ("GET", "/v1/accounts/{id}", "product"),
    ("POST", "/v1/accounts/{id}/takes", "product"),
    ("POST", "/v1/takes/batch", "product"),
    ("POST", "/v1/takes/{n}/release", "product"),
    ("GET", "/v1/accounts/{id}/usage", "product"),
    ("GET", "/v1/admin/accounts/{id}", "admin"),
    ("PUT", "/v1/admin/accounts/{id}/overrides/{metric}", "admin"),
    ("DELETE", "/v1/admin/accounts/{id}/overrides/{metric}", "admin"),
    ("POST", "/v1/admin/accounts/{id}/reset", "admin"),
    ("DELETE", "/v1/admin/accounts/{id}", "admin"),
    ("GET", "/v1/admin/events", "admin"),
    ("POST", "/v1/admin/events/{n}/replay", "admin"),
    ("GET", "/v1/ledger", "finance"),
    ("GET", "/v1/ledger.csv", "finance"),
    ("GET", "/v1/reconciliation", "finance"),
    ("GET", "/v1/audit", "finance"),
    ("POST", "/webhooks/stripe", None),
    ("POST", "/webhooks/revenuecat", None),
    ("GET", "/healthz", None),
    ("GET", "/openapi.json", None),
]
QUERY_KEYS = ["metric", "period", "cursor", "limit", "account_id", "kind", "status", "provider"]

segment = st.sampled_from(
    ["acc-1", "urls", "seats", "1", "0", "2026-01", "%C2%B2", "%D9%A1", "%0A", "%00", "..", ""]
) | st.text(max_size=12).map(lambda s: s.replace("/", "").replace("?", "").replace("#", ""))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=6,
)
field_values = st.sampled_from(["urls", "seats", "user", "2026-01", "5", 1, None, -1, 2**63]) | json_values
bodies = (
    st.dictionaries(
        st.sampled_from(
            [
                "metric",
                "units",
                "idempotency_key",
                "kind",
                "stripe_customer_id",
                "limit",
                "lines",
                "items",
                "x",
            ]
        ),
        field_values,
        max_size=4,
    ).map(lambda d: json.dumps(d).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
    | st.sampled_from([b"", b"[" * 5000, b'{"event": ' * 3000, b'"\\ud800"', b'{"metric": "\\udc00"}'])
)


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    route=st.sampled_from(ROUTES),
    method=st.sampled_from([None, None, None, None, "GET", "POST", "PUT", "DELETE", "PATCH", "BREW"]),
    ids=st.fixed_dictionaries({"id": segment, "metric": segment, "n": segment}),
    query=st.dictionaries(st.sampled_from(QUERY_KEYS), segment, max_size=3),
    body=bodies,
    role=st.sampled_from(["own", "own", "own", "product", "admin", "finance", None]),
)
def test_no_generated_request_gets_a_5xx(client, keys, account, route, method, ids, query, body, role):
    """Mostly the route's own method and role, so that most requests get past routing and auth."""
    verb, template, own_role = route
    path = template.format(**ids)
    role = own_role if role == "own" else role
    headers = dict(keys[role]) if role else {}
    headers["Content-Type"] = "application/json"
    r = client.open(path, method=method or verb, query_string=query, data=body, headers=headers)
    assert r.status_code < 500, (verb, path, query, body, r.status_code, r.get_data(as_text=True)[:300])
    if r.status_code >= 400:
        assert_error(r, r.status_code)

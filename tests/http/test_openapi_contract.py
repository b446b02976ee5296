"""The service keeps its own document. Schemathesis: every operation of /openapi.json, every check
schemathesis has, with each role's key; bounded (examples per operation, derandomized, no example
database) so that it stays a fixed, small cost of the suite. Then every route in each state a client
can meet it in (deleted account, exhausted quota, ...): the status and code it answers are among
those its document lists."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.generation.modes import GenerationMode

from tests.conftest import REVENUECAT_AUTH
from tests.http.conftest import put_account
from tests.webhooks.helpers import sign

MAX_EXAMPLES = 50
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
# Explicit, not a schemathesis.toml found by walking up from the working directory.
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            # A valid request may meet state that refuses it, as the document says: 410 for an
            # account an earlier example deleted (409, for an exhausted quota, is in the defaults).
            "positive_data_acceptance": {"expected-statuses": ["2xx", "401", "403", "404", "409", "410"]},
        },
        "operations": [
            {
                # Rules between query parameters or fields that OpenAPI 3.0 cannot say, so a
                # valid-looking request may be 422: the check takes exactly one of `metric` and
                # `feature`; usage's `period` is of the metric's kind (a month, a day for a daily
                # metric, none for an allocation); a multi-line take's lines name distinct metrics;
                # a usage history's `to` is not before `from` and at most 400 days after it.
                "include-path": path,
                "checks": {
                    "positive_data_acceptance": {
                        "expected-statuses": ["2xx", "401", "403", "404", "409", "410", "422"]
                    }
                },
            }
            for path in (
                "/v1/accounts/{id}/check",
                "/v1/accounts/{id}/usage",
                "/v1/accounts/{id}/takes",
                "/v1/accounts/{id}/usage/history",
                # an endpoint's URL must resolve to public addresses only (issue 26), which no schema
                # can say: a valid-looking URL may be 422 invalid_url
                "/v1/admin/webhook-endpoints",
            )
        ],
    }
)


def _callers(case: Any, keys: Any) -> list[dict[str, str]]:
    """The headers of each caller: a webhook authenticates as its provider does, /v1 with each
    role's key (a route the role may not call must answer 403, as documented). A negative case
    that left out its credential header is sent as generated: that omission is what it tests."""
    header = "Stripe-Signature" if case.path == "/webhooks/stripe" else "Authorization"
    if case.meta.generation.mode.is_negative and (
        header not in (case.headers or {}) or header == "Stripe-Signature"  # a signature can be wrong
    ):
        return [{}]
    if case.path == "/webhooks/stripe":
        # signed over the bytes the WSGI client sends (json.dumps, as werkzeug serializes json=)
        raw = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
        return [{header: sign(raw, timestamp=int(time.time()))}]
    if case.path == "/webhooks/revenuecat":
        return [{header: REVENUECAT_AUTH}]
    return [keys[role] for role in ("product", "admin", "finance")]


def test_the_service_keeps_its_document(app: Any, client: Any, keys: Any, subtests: Any) -> None:
    # Not schemathesis' pytest plugin: its lazy schema (an app from a fixture) needs pytest < 9.
    put_account(client, keys, "acc-1")  # the document's example account id, so examples reach it
    api = schemathesis.openapi.from_wsgi("/openapi.json", app, config=CONFIG)
    for result in api.get_all_operations():
        operation = result.ok()
        strategies = [operation.as_strategy(generation_mode=mode) for mode in MODES]
        strategies += api.get_strategies_from_examples(operation)

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=st.one_of(strategies))
        def keeps_its_document(case: Any) -> None:
            if case.path.startswith("/webhooks/") and case.meta.generation.mode.is_positive:
                # A provider's event may hold any JSON, but none sends a NUL, which the inbox's
                # jsonb refuses (400 malformed_body); the document cannot say so of every field.
                assume(not isinstance(case.body, bytes) and "\\u0000" not in json.dumps(case.body))
            for headers in _callers(case, keys):
                case.call_and_validate(headers=headers)

        with subtests.test(operation.label):
            keeps_its_document()


# Every route, in each state a client can meet it in, answers only what its document lists: a
# status of its responses and, for a refusal, one of that status's codes. Schemathesis reaches these
# states only by chance (a deleted account, an exhausted quota, a reused idempotency key), so they
# are set up here. Webhooks are left to the test above: they need signed provider payloads.
BODIES = {
    "AccountPut": {"kind": "user"},
    "TakeRequest": {"metric": "urls"},
    "TakeBatchRequest": {"items": [{"account_id": "acc-1", "metric": "urls"}]},
    "OverridePut": {"limit": 5},
    "ResetRequest": {"metric": "urls"},
    "FeaturePut": {"enabled": True},
    "GrantRequest": {"metric": "urls", "units": 1, "idempotency_key": "g"},
    "WebhookEndpointCreate": {"url": "https://93.184.216.34/hooks", "events": ["credits.granted"]},
}
QUERIES = {"metric": "urls", "period": "2020-01", "from": "2020-01-01", "to": "2020-01-31"}
# A valid query of an operation whose parameters are all optional but one of them is needed.
ONE_OF_QUERIES = {"/v1/accounts/{id}/check": {"metric": "urls"}}
PATH = {"id": "acc-1", "metric": "urls", "feature": "sso", "take_id": "1", "inbox_id": "1", "grant_id": "1"}
PATH |= {"endpoint_id": "we_1", "delivery_id": "1"}
# (what changes, how): each state replaces path arguments, the body or the query of a valid request.
STATES: list[tuple[str, dict[str, Any]]] = [
    ("valid", {}),
    ("unknown account", {"path": {"id": "ghost"}}),
    ("deleted account", {"path": {"id": "gone"}}),
    ("invalid account id", {"path": {"id": "bad id!"}}),
    (
        "id that no rule accepts",
        {"path": {"id": "a%2Fb", "take_id": "x", "inbox_id": "x", "grant_id": "x", "delivery_id": "x"}},
    ),
    (
        "unknown take or event",
        {"path": {"take_id": "999999", "inbox_id": "999999", "grant_id": "999999", "delivery_id": "999999"}},
    ),
    ("unknown webhook endpoint", {"path": {"endpoint_id": "we_nothing"}}),
    ("a refused webhook URL", {"body": {"url": "https://127.0.0.1/hooks"}}),
    ("unknown metric in the path", {"path": {"metric": "nope"}}),
    ("unknown metric in the body or query", {"body": {"metric": "nope"}, "query": {"metric": "nope"}}),
    ("unknown feature in the path", {"path": {"feature": "nope"}}),
    ("unknown feature in the query", {"query": {"metric": None, "feature": "nope"}}),
    ("a body that is not JSON", {"raw": b"not json"}),
    ("an unknown field", {"body": {"extra": 1}, "query": {"extra": "1"}}),
    ("an exhausted quota", {"path": {"id": "full"}}),
    ("a reused idempotency key", {"path": {"id": "keyed"}, "body": {"idempotency_key": "k", "units": 2}}),
    ("a customer of another account", {"body": {"stripe_customer_id": "cus_1"}}),
    ("the wrong role", {"role": "finance"}),
    ("no key", {"role": None}),
]


def _documented(doc: dict[str, Any], path: str, method: str) -> dict[int, set[str] | None]:
    """The statuses an operation documents, each with its error codes (None: not a refusal)."""
    out: dict[int, set[str] | None] = {}
    for status, response in doc["paths"][path][method]["responses"].items():
        schema = response.get("content", {}).get("application/json", {}).get("schema", {})
        enums = [s["properties"]["error"]["enum"] for s in schema.get("allOf", []) if "properties" in s]
        out[int(status)] = set(enums[0]) if enums else None
    return out


def _request(operation: dict[str, Any], path: str, state: dict[str, Any]) -> dict[str, Any]:
    args = {**PATH, **state.get("path", {})}
    url = path.format(**args)
    query = {p["name"]: QUERIES[p["name"]] for p in operation.get("parameters", []) if p.get("required")}
    query.update(ONE_OF_QUERIES.get(path, {}))
    body = None
    if "requestBody" in operation:
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        # A body of several forms (a take: one metric, or lines) is sent in its first form.
        name = schema.get("oneOf", [schema])[0]["$ref"].rsplit("/", 1)[1]
        body = {**BODIES[name], **state.get("body", {})}
    query.update(state.get("query", {}))
    query = {k: v for k, v in query.items() if v is not None}
    data = state.get("raw") if body is not None and "raw" in state else json.dumps(body) if body else None
    return {"path": url, "query_string": query, "data": data}


def _role(operation: dict[str, Any]) -> str | None:
    """The first role the operation names ("Role: product or admin."), None for no key."""
    if not operation.get("security"):
        return None
    return str(operation["description"]).removeprefix("Role: ").split()[0].strip(".")


def _setup(client: Any, keys: Any) -> None:
    for account in ("acc-1", "gone", "full", "keyed"):
        put_account(client, keys, account)
    put_account(client, keys, "other", stripe_customer_id="cus_1")
    admin, p = keys["admin"], keys["product"]
    assert client.delete("/v1/admin/accounts/gone", headers=admin).status_code == 200
    r = client.put("/v1/admin/accounts/full/overrides/urls", json={"limit": 0}, headers=admin)
    assert r.status_code == 200
    r = client.post("/v1/accounts/keyed/takes", json={"metric": "urls", "idempotency_key": "k"}, headers=p)
    assert r.status_code == 201


def test_every_route_documents_what_it_answers(client: Any, keys: Any) -> None:
    doc = client.get("/openapi.json").json
    _setup(client, keys)
    operations = [
        (path, method, operation)
        for path, ops in doc["paths"].items()
        for method, operation in ops.items()
        if method != "parameters" and not path.startswith("/webhooks/")
    ]
    answered: set[tuple[str, str, int]] = set()
    # Deleting acc-1 last, so that the other routes meet it live.
    for path, method, operation in sorted(operations, key=lambda o: (o[1] == "delete", o[0], o[1])):
        documented = _documented(doc, path, method)
        for name, state in STATES:
            who = state.get("role", _role(operation)) if _role(operation) else None
            r = client.open(
                method=method.upper(),
                headers=keys[who] if who else {},
                content_type="application/json",
                **_request(operation, path, state),
            )
            what = (method, path, name, r.status_code, r.get_data(as_text=True))
            assert r.status_code in documented, what
            codes = documented[r.status_code]
            assert codes is None or r.json["error"] in codes, (what, codes)
            answered.add((method, path, r.status_code))
    # The states reach the refusals they are about (else the loop above proves little).
    for needed in [
        ("post", "/v1/accounts/{id}/takes", 410),
        ("put", "/v1/accounts/{id}", 410),
        ("post", "/v1/admin/accounts/{id}/reset", 410),
        ("post", "/v1/accounts/{id}/takes", 409),
        ("put", "/v1/accounts/{id}", 409),
        ("post", "/v1/takes/{take_id}/release", 404),
        ("get", "/v1/accounts/{id}/check", 410),
        ("get", "/v1/accounts/{id}/check", 404),
        ("put", "/v1/admin/accounts/{id}/features/{feature}", 404),
        ("delete", "/v1/admin/accounts/{id}/features/{feature}", 422),
        ("post", "/v1/admin/webhook-endpoints", 201),
        ("post", "/v1/admin/webhook-endpoints", 422),
        ("delete", "/v1/admin/webhook-endpoints/{endpoint_id}", 404),
        ("post", "/v1/admin/webhook-deliveries/{delivery_id}/retry", 404),
    ]:
        assert needed in answered


def test_the_document_lists_what_issue_20_found_missing(client: Any) -> None:
    paths = client.get("/openapi.json").json["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            if method != "parameters":
                assert {"413", "414", "431"} <= set(operation["responses"]), (method, path)
    for method, path in [
        ("post", "/v1/accounts/{id}/takes"),
        ("put", "/v1/accounts/{id}"),
        ("post", "/v1/admin/accounts/{id}/reset"),
    ]:
        gone = paths[path][method]["responses"]["410"]
        assert gone["content"]["application/json"]["schema"]["allOf"][1]["properties"]["error"]["enum"] == [
            "account_deleted"
        ]


def test_a_status_written_by_hand_that_a_refusal_answers_stops_the_build(app: Any) -> None:
    from service.errors import UnknownAccount
    from service.http import openapi
    from service.http.errors import refuses

    @app.get("/v1/handwritten")
    @refuses(UnknownAccount)
    def handwritten() -> str:
        """A route that writes its refusal's status itself.
        ---
        get:
          responses:
            200: {description: ok}
            404: {description: written by hand}
        """
        return ""

    with pytest.raises(ValueError, match="404 is answered by a refusal"):
        openapi.build(app)

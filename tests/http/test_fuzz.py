"""Whatever a client sends to the take endpoint, the answer is never a 5xx, and every error is JSON."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.db.helpers import counter, ledger_used
from tests.http.conftest import assert_error

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=8,
)
tricky_text = st.text(st.characters(categories=("Cc", "Cs", "Zs", "Ll")), max_size=5)  # NUL, surrogates
take_like = st.fixed_dictionaries(
    {},
    optional={
        "metric": st.sampled_from(["urls", "seats", "api_calls"]) | json_values,
        "units": st.integers(1, 3) | st.integers(min_value=-(2**70), max_value=2**70) | json_values,
        "idempotency_key": st.text(max_size=300) | tricky_text | json_values,
    },
).flatmap(
    lambda d: st.dictionaries(st.text(max_size=10), json_values, max_size=2).map(lambda extra: {**extra, **d})
)
nearly_valid = st.fixed_dictionaries(
    {"metric": st.sampled_from(["urls", "seats", "api_calls"])},
    optional={
        "units": st.integers(1, 3),
        "idempotency_key": tricky_text | st.text(min_size=250, max_size=260),
    },
)
bodies = (
    nearly_valid.map(lambda b: json.dumps(b).encode())
    | take_like.map(lambda b: json.dumps(b).encode())
    | json_values.map(lambda b: json.dumps(b).encode())
    | st.binary(max_size=200)
    | st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass"))
)
FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(
    body=bodies,
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
    ),
)
def test_take_endpoint_never_answers_5xx(client, keys, account, conn, body, content_type):
    headers = dict(keys["product"])
    if content_type:
        headers["Content-Type"] = content_type
    r = client.post(f"/v1/accounts/{account}/takes", data=body, headers=headers)
    assert r.status_code < 500, (body, r.status_code, r.get_data(as_text=True))
    if r.status_code >= 400:
        assert_error(r, r.status_code)
    c = counter(conn, account, "urls")
    assert c["used"] == ledger_used(conn, account, "urls", c["period"])


@FUZZ
@given(
    body=st.fixed_dictionaries(
        {"kind": st.sampled_from(["user", "team"]) | json_values},
        optional={"stripe_customer_id": st.text(max_size=20) | tricky_text | json_values},
    )
)
def test_account_bodies_never_answer_5xx(client, keys, body):
    r = client.put("/v1/accounts/fuzzed", data=json.dumps(body), headers=keys["product"])
    assert r.status_code < 500, (body, r.status_code, r.get_data(as_text=True))


@FUZZ
@given(account_id=st.text(min_size=1, max_size=140).filter(lambda s: "/" not in s and s not in (".", "..")))
def test_account_ids_never_answer_5xx(client, keys, account_id):
    r = client.put(f"/v1/accounts/{account_id}", json={"kind": "user"}, headers=keys["product"])
    assert r.status_code in (200, 201, 404, 422), (account_id, r.status_code, r.get_data(as_text=True))

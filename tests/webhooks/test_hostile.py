"""Hostile but correctly signed or authorized webhook bodies: a 4xx with nothing stored, never a 5xx.
And a Stripe-Signature header is read exactly as stripe-python reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest
import stripe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.errors import InvalidSignature
from service.webhooks import revenuecat
from service.webhooks import stripe as stripe_adapter
from tests.conftest import STRIPE_SECRET
from tests.webhooks.helpers import (
    STRIPE_ACCOUNT,
    inbox,
    now,
    post_revenuecat,
    post_stripe,
    revenuecat_event,
    sign,
)

DEEP = "[" * 100_000 + "]" * 100_000
DAY = 86_400


def _refused(r: Any, conn: Any, status: int = 400) -> None:
    assert r.status_code == status, r.get_data(as_text=True)
    assert r.is_json and {"error", "message"} <= set(r.json)
    assert inbox(conn) == []


def _stripe_event(**fields: Any) -> dict[str, Any]:
    return {"object": "event", "id": "evt_hostile", "type": "invoice.paid", "created": now(), **fields}


def test_stripe_json_nested_100000_deep_is_400(client, conn):
    body = json.dumps(_stripe_event(data={"object": "PLACEHOLDER"})).replace('"PLACEHOLDER"', DEEP)
    _refused(post_stripe(client, body), conn)


def test_stripe_body_that_is_only_deep_json_is_400(client, conn):
    _refused(post_stripe(client, DEEP), conn)


def test_revenuecat_json_nested_100000_deep_is_400(client, conn):
    event = revenuecat_event("initial_purchase")
    body = json.dumps(event).replace('"event": {', '"deep": ' + DEEP + ', "event": {', 1)
    assert DEEP in body
    _refused(post_revenuecat(client, body), conn)
    _refused(post_revenuecat(client, DEEP), conn)


@pytest.mark.parametrize("created", [2**40, 2**40 - 1, 253402300800])
def test_stripe_created_past_what_a_timestamp_holds_is_400(client, conn, created):
    _refused(post_stripe(client, _stripe_event(created=created)), conn)


def test_stripe_created_on_the_last_representable_second_is_stored(client, conn):
    r = post_stripe(client, _stripe_event(created=253402300799))
    assert r.status_code == 200, r.json
    assert len(inbox(conn)) == 1


@pytest.mark.parametrize("at_ms", [2**49, 2**50 - 1, 253402300800000])
def test_revenuecat_event_timestamp_past_what_a_timestamp_holds_is_400(client, conn, at_ms):
    _refused(post_revenuecat(client, revenuecat_event("initial_purchase", at_ms=at_ms)), conn)


@pytest.mark.parametrize("odd", ["\\ud800", "\\udfff", "x\\udc00y", "\\ud800\\ud800"])
def test_a_lone_surrogate_in_an_event_id_is_400(client, conn, odd):
    stripe_body = json.dumps(_stripe_event(id="PLACEHOLDER")).replace("PLACEHOLDER", odd)
    _refused(post_stripe(client, stripe_body), conn)
    rc_body = json.dumps(revenuecat_event("initial_purchase", event_id="PLACEHOLDER"))
    _refused(post_revenuecat(client, rc_body.replace("PLACEHOLDER", odd)), conn)


@pytest.mark.parametrize("field", ["app_user_id", "original_transaction_id", "product_id", "type"])
def test_a_lone_surrogate_in_any_revenuecat_field_is_400(client, conn, field):
    body = json.dumps(revenuecat_event("initial_purchase", **{field: "PLACEHOLDER"}))
    _refused(post_revenuecat(client, body.replace("PLACEHOLDER", "a\\ud800")), conn)


def test_a_surrogate_pair_is_not_lone(client, conn):
    """An escaped pair is one character (here an emoji) and is stored like any other."""
    body = json.dumps(revenuecat_event("initial_purchase", event_id="PLACEHOLDER", type="TEST")).replace(
        "PLACEHOLDER", "e\\ud83d\\ude00"
    )
    r = post_revenuecat(client, body)
    assert r.status_code == 200, r.json
    assert inbox(conn)[0]["event_id"] == "e\U0001f600"


def test_a_header_with_two_timestamps_is_read_as_stripe_reads_it(client, conn):
    """stripe-python takes the first item whose key is exactly `t`: a header whose first `t`
    (with a blank before it) is now, and whose `v1` signs tomorrow, must not pass."""
    body = json.dumps(_stripe_event()).encode()
    tomorrow = now() + DAY
    sig = sign(body, timestamp=tomorrow).split("v1=")[1]
    for header in (
        f" t={now()},t={tomorrow},v1={sig}",
        f"t ={now()},t={tomorrow},v1={sig}",
        f"t={now()},t={tomorrow},v1={sig}",
        f"\tt={now()},t={tomorrow},v1={sig}",
    ):
        _refused(post_stripe(client, body, header=header), conn)


@pytest.mark.parametrize("t", ["9" * 400, "-" + "9" * 400, "9" * 5000, "1e10", ""])
def test_an_absurd_timestamp_is_400(client, conn, t):
    body = json.dumps(_stripe_event()).encode()
    _refused(post_stripe(client, body, header=f"t={t},v1={'0' * 64}"), conn)


def test_the_first_exact_t_is_the_one_checked_and_signed(client, conn):
    body = json.dumps(_stripe_event()).encode()
    t = now()
    sig = sign(body, timestamp=t).split("v1=")[1]
    r = post_stripe(client, body, header=f"t={t},t={t + DAY},v1={sig}")
    assert r.status_code == 200, r.json


header_items = st.one_of(
    st.sampled_from(["t", " t", "t ", "v1", " v1", "v0", "x", "T"]).flatmap(
        lambda key: st.sampled_from(["1700000000", " 1700000000", "+17", "1_0", "١٢", "", "abc", "a=b"]).map(
            lambda value: f"{key}={value}"
        )
    ),
    st.text(max_size=8),
)


@given(st.lists(header_items, max_size=5).map(",".join))
def test_the_header_parse_agrees_with_stripe_python(header):
    try:
        theirs: tuple[int, list[str]] | None = stripe.WebhookSignature._get_timestamp_and_signatures(
            header, "v1"
        )
    except Exception:
        theirs = None
    try:
        ours: tuple[int, list[str]] | None = stripe_adapter.parse_header(header)
    except InvalidSignature:
        ours = None
    assert ours == theirs


def test_the_adapter_checks_the_hmac_over_the_timestamp_it_checked():
    body = json.dumps(_stripe_event()).encode()
    t = now()
    good = sign(body, timestamp=t)
    assert stripe_adapter.verify(body, good, [STRIPE_SECRET]).event_id == "evt_hostile"
    late = sign(body, timestamp=t + DAY).split("v1=")[1]
    with pytest.raises(InvalidSignature):
        stripe_adapter.verify(body, f" t={t},t={t + DAY},v1={late}", [STRIPE_SECRET])


odd_text = st.text(max_size=12) | st.text(st.characters(categories=("Cs", "Cc")), min_size=1, max_size=3)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | odd_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
times = (
    st.integers(-(2**70), 2**70)
    | st.just(now())
    | st.sampled_from([2**40, 2**49, 253402300799])
    | json_values
)
stripe_events = st.fixed_dictionaries(
    {
        "object": st.just("event") | json_values,
        "id": st.text(min_size=1, max_size=10) | odd_text | json_values,
        "type": st.sampled_from([*sorted(stripe_adapter.ALLOWED_TYPES), "x"]) | json_values,
        "created": times,
        "livemode": st.booleans() | json_values,
        "data": st.fixed_dictionaries(
            {},
            optional={
                "object": st.dictionaries(
                    st.sampled_from(
                        ["id", "status", "customer", "metadata", "items", "parent", "client_reference_id"]
                    ),
                    json_values | st.sampled_from(["active", "canceled", "sub_1", STRIPE_ACCOUNT]),
                    max_size=5,
                )
            },
        ),
    }
)
revenuecat_events = st.fixed_dictionaries(
    {
        "event": st.fixed_dictionaries(
            {
                "id": st.text(min_size=1, max_size=10) | odd_text | json_values,
                "type": st.sampled_from([*sorted(revenuecat.ALLOWED_TYPES), "X"]) | json_values,
                "event_timestamp_ms": times,
            },
            optional={
                key: json_values | st.just(STRIPE_ACCOUNT)
                for key in (
                    "app_user_id",
                    "original_app_user_id",
                    "aliases",
                    "original_transaction_id",
                    "product_id",
                    "entitlement_ids",
                    "store",
                    "period_type",
                    "environment",
                    "transferred_from",
                    "transferred_to",
                )
            },
        )
    }
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(stripe_event=stripe_events, revenuecat_event=revenuecat_events)
def test_no_generated_signed_webhook_gets_a_5xx(client, acc, stripe_event, revenuecat_event):
    for r in (post_stripe(client, stripe_event), post_revenuecat(client, revenuecat_event)):
        assert r.status_code in (200, 400), (stripe_event, revenuecat_event, r.get_data(as_text=True)[:300])
        assert r.is_json

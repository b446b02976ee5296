"""Verification comes first: a request that fails it gets a 4xx JSON error and stores nothing.
Signatures are computed with the real scheme (stripe's generate_signature_header), never mocked."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from tests.conftest import REVENUECAT_AUTH, STRIPE_OLD_SECRET, STRIPE_SECRET
from tests.webhooks.helpers import body_of, fixture, inbox, now, post_revenuecat, post_stripe, sign

EVENT = fixture("stripe", "customer.subscription.updated")


def v1(body: bytes, secret: str, t: int) -> str:
    return hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()


def refused(r: Any, status: int, conn: Any) -> None:
    assert r.status_code == status, r.data
    assert set(r.json) >= {"error", "message"}
    assert inbox(conn) == []
    assert conn.execute("SELECT count(*) FROM subscriptions").fetchone() == (0,)


def test_valid_signature(client: Any, conn: Any, acc: str) -> None:
    r = post_stripe(client, EVENT)
    assert (r.status_code, r.json["status"]) == (200, "applied")
    assert len(inbox(conn)) == 1


def test_tampered_body_one_byte(client: Any, conn: Any, acc: str) -> None:
    body = body_of(EVENT)
    header = sign(body)
    tampered = body.replace(b'"status": "active"', b'"status": "activf"')
    assert tampered != body and len(tampered) == len(body)
    refused(post_stripe(client, tampered, header=header), 400, conn)


def test_flipped_last_byte(client: Any, conn: Any) -> None:
    body = body_of(EVENT)
    header = sign(body)
    refused(post_stripe(client, body[:-1] + bytes([body[-1] ^ 1]), header=header), 400, conn)


def test_wrong_secret(client: Any, conn: Any) -> None:
    r = post_stripe(client, EVENT, secret="whsec_not_ours")
    refused(r, 400, conn)
    assert r.json["error"] == "invalid_signature"


def test_missing_header(client: Any, conn: Any) -> None:
    refused(post_stripe(client, EVENT, header=""), 400, conn)


def test_only_v0_signature(client: Any, conn: Any) -> None:
    body, t = body_of(EVENT), now()
    refused(post_stripe(client, body, header=f"t={t},v0={v1(body, STRIPE_SECRET, t)}"), 400, conn)


@pytest.mark.parametrize("header", ["garbage", "t=abc,v1=00", "v1=00", "t=,v1="])
def test_malformed_header(client: Any, conn: Any, header: str) -> None:
    refused(post_stripe(client, EVENT, header=header), 400, conn)


def test_rotated_secrets_one_v1_per_secret(client: Any, conn: Any, acc: str) -> None:
    """During a rotation Stripe sends a v1 per active secret; either matching one passes."""
    body, t = body_of(EVENT), now()
    header = f"t={t},v1={v1(body, 'whsec_retired', t)},v1={v1(body, STRIPE_SECRET, t)}"
    assert post_stripe(client, body, header=header).status_code == 200


def test_signed_with_the_older_configured_secret(client: Any, conn: Any, acc: str) -> None:
    assert post_stripe(client, EVENT, secret=STRIPE_OLD_SECRET).status_code == 200


@pytest.mark.parametrize("offset", [-301, 301, -3600, 86_400])
def test_timestamp_outside_300_s_either_way(client: Any, conn: Any, offset: int) -> None:
    r = post_stripe(client, EVENT, timestamp=now() + offset)
    refused(r, 400, conn)
    assert "300" in r.json["message"]


@pytest.mark.parametrize("offset", [-290, 290])
def test_timestamp_inside_the_window(client: Any, conn: Any, acc: str, offset: int) -> None:
    assert post_stripe(client, EVENT, timestamp=now() + offset).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2, 3]",
        b'"a string"',
        b"null",
        b"{}",
        b'{"object": "event"}',
        b'{"object": "event", "id": "evt_1", "type": "x"}',
        b'{"object": "event", "id": "evt_1", "type": "x", "created": "yesterday"}',
        b'{"object": "event", "id": "evt_1", "type": "x", "created": true}',
        b'{"object": "event", "id": 5, "type": "x", "created": 1}',
        b'{"object": "event", "id": "", "type": "x", "created": 1}',
        b'{"object": "v2.core.event", "id": "evt_1", "type": "v1.customer.subscription.updated"}',
        b'{"object": "event", "id": "evt_1", "type": "x", "created": 99999999999999999999}',
        b'{"object": "event", "id": "evt_nul", "type": "x\\u0000", "created": 1}',
        b'{"object": "event", "id": "evt_1", "type": "x", "created": 1, ',
    ],
)
def test_malformed_stripe_body_is_400(client: Any, conn: Any, body: bytes) -> None:
    refused(post_stripe(client, body), 400, conn)


def test_non_utf8_stripe_body_is_400(client: Any, conn: Any) -> None:
    body = b'{"object": "event", "id": "evt_\xff", "type": "x", "created": 1}'
    t = now()
    refused(post_stripe(client, body, header=f"t={t},v1={v1(body, STRIPE_SECRET, t)}"), 400, conn)


def test_verified_event_with_bad_contents_is_stored_failed(client: Any, conn: Any, acc: str) -> None:
    """Signed by Stripe, shaped like an event, but no data.object: stored, acknowledged, failed."""
    body = json.dumps(
        {"object": "event", "id": "evt_x", "type": "customer.subscription.updated", "created": 1}
    )
    r = post_stripe(client, body)
    assert (r.status_code, r.json["status"]) == (200, "failed")
    assert inbox(conn)[0]["error"] == "the event has no data.object"


def test_stripe_not_configured_is_503(settings: Any, conn: Any) -> None:
    from dataclasses import replace

    from service import create_app

    app = create_app(replace(settings, stripe_webhook_secrets=()))
    try:
        r = post_stripe(app.test_client(), EVENT)
        assert r.status_code == 503 and r.json["error"] == "webhooks_not_configured"
    finally:
        app.extensions["quota"].pool.close()


# RevenueCat: the Authorization header, compared in constant time.

RC = fixture("revenuecat", "initial_purchase")


def test_revenuecat_right_header(client: Any, keys: Any, conn: Any) -> None:
    from tests.webhooks.helpers import create_account

    create_account(client, keys, "acc_7f3c21")
    r = post_revenuecat(client, RC, auth=REVENUECAT_AUTH)
    assert (r.status_code, r.json["status"]) == (200, "applied")


@pytest.mark.parametrize(
    "auth",
    [
        None,
        "",
        "Bearer rc-test-aut",
        "Bearer rc-test-auth ",
        "bearer rc-test-auth",
        "rc-test-auth",
        "Bearer é",
    ],
)
def test_revenuecat_missing_or_wrong_header(client: Any, conn: Any, auth: str | None) -> None:
    r = post_revenuecat(client, RC, auth=auth)
    refused(r, 401, conn)
    assert r.json["error"] == "unauthorized"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"nope",
        b"[]",
        b"{}",
        b'{"event": []}',
        b'{"event": {"id": "x", "type": "RENEWAL"}}',
        b'{"event": {"id": "x", "type": "RENEWAL", "event_timestamp_ms": "1"}}',
        b'{"event": {"id": "x", "type": "RENEWAL", "event_timestamp_ms": 1.5}}',
        b'{"event": {"id": "x", "type": "RENEWAL", "event_timestamp_ms": -1}}',
        b'{"event": {"type": "RENEWAL", "event_timestamp_ms": 1}}',
        b'{"event": {"id": "x", "event_timestamp_ms": 1}}',
        b'{"event": {"id": "x\\u0000", "type": "RENEWAL", "event_timestamp_ms": 1}}',
        b'{"event": {"id": "\xff", "type": "RENEWAL", "event_timestamp_ms": 1}}',
    ],
)
def test_malformed_revenuecat_body_is_400(client: Any, conn: Any, body: bytes) -> None:
    refused(post_revenuecat(client, body), 400, conn)


def test_revenuecat_verified_event_with_odd_contents_never_500(client: Any, keys: Any, conn: Any) -> None:
    """Valid envelope, junk fields everywhere else: stored with a status, answered 200."""
    from tests.webhooks.helpers import create_account

    create_account(client, keys, "acc_7f3c21")
    junk: list[Any] = [None, 5, "x", [], {}, [1, None], True]
    for i, value in enumerate(junk):
        event = {"id": f"j{i}", "type": "INITIAL_PURCHASE", "event_timestamp_ms": 1000 + i}
        for key in (
            "app_user_id",
            "aliases",
            "entitlement_ids",
            "product_id",
            "store",
            "original_transaction_id",
        ):
            event[key] = value
        r = post_revenuecat(client, {"event": event})
        assert r.status_code == 200, r.json
    assert {row["status"] for row in inbox(conn)} <= {"unmatched", "failed", "applied"}


@pytest.mark.parametrize("odd", ["\\u0000", "\\ud800", "\\udfff\\ud800"])
def test_odd_unicode_in_a_verified_body_is_never_500(client: Any, conn: Any, acc: str, odd: str) -> None:
    body = json.dumps(EVENT).replace('"comment": null', f'"comment": "{odd}"', 1)
    assert odd in body
    r = post_stripe(client, body)
    assert r.status_code in (200, 400), r.data
    assert len(inbox(conn)) == (1 if r.status_code == 200 else 0)

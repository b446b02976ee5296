"""Helpers for webhook tests: fixtures loaded from tests/fixtures, signed with the test secrets the
app is configured with (never a mocked verification), and small account helpers over HTTP."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import stripe

from service.webhooks.samples import SAMPLES
from tests.conftest import FIXTURES, REVENUECAT_AUTH, STRIPE_SECRET

SUB_ID = "sub_1RkT9xLt4dXK03v5aB7cD2eF"
CUSTOMER = "cus_SfT9ab12CdEf34"
STRIPE_ACCOUNT = "acc_7f3c21"


DAY_MS = 86_400_000
# RevenueCat access is bounded by wall-clock time (expiration_at_ms), and event times more than an
# hour in the future are not applied, so the RevenueCat fixtures' times (a story from June to
# August 2026) are moved when loaded: the story's events to end two days ago, its expirations to
# start a day from now. Order and spacing within each kind are kept.
EXPIRY_FIELDS = ("expiration_at_ms", "grace_period_expiration_at_ms")


def _rc_times(field: str) -> list[int]:
    return [
        v
        for p in (FIXTURES / "revenuecat").glob("*.json")
        if isinstance(v := json.loads(p.read_text())["event"].get(field), int)
    ]


def _fresh(event: dict[str, Any]) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    past = now_ms - 2 * DAY_MS - max(_rc_times("event_timestamp_ms"))
    future = now_ms + DAY_MS - min(_rc_times("expiration_at_ms"))
    for key, value in list(event.items()):
        if key.endswith("_ms") and isinstance(value, int):
            event[key] = value + (future if key in EXPIRY_FIELDS else past)
    return event


def _fixture_files(provider: str) -> list[Path]:
    """The tests' own fixtures and the samples the package ships for `webhooks send-test`."""
    return [*(FIXTURES / provider).glob("*.json"), *(SAMPLES / provider).glob("*.json")]


def fixture(provider: str, name: str) -> dict[str, Any]:
    path = next(p for p in _fixture_files(provider) if p.stem == name)
    data: dict[str, Any] = json.loads(path.read_text())
    if provider == "revenuecat":
        _fresh(data["event"])
    return data


def stripe_fixtures() -> list[str]:
    return sorted(p.stem for p in _fixture_files("stripe"))


def revenuecat_fixtures() -> list[str]:
    return sorted(p.stem for p in (FIXTURES / "revenuecat").glob("*.json"))


def body_of(payload: dict[str, Any] | str | bytes) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode()
    return json.dumps(payload, indent=2).encode()


def sign(body: bytes, *, secret: str = STRIPE_SECRET, timestamp: int | None = None) -> str:
    return stripe.WebhookSignature.generate_signature_header(body.decode(), secret, timestamp=timestamp)


def post_stripe(
    client: Any,
    payload: dict[str, Any] | str | bytes,
    *,
    secret: str = STRIPE_SECRET,
    timestamp: int | None = None,
    header: str | None = None,
) -> Any:
    body = body_of(payload)
    headers = {"Content-Type": "application/json"}
    sig = header if header is not None else sign(body, secret=secret, timestamp=timestamp)
    if sig:
        headers["Stripe-Signature"] = sig
    return client.post("/webhooks/stripe", data=body, headers=headers)


def post_revenuecat(
    client: Any, payload: dict[str, Any] | str | bytes, *, auth: str | None = REVENUECAT_AUTH
) -> Any:
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    return client.post("/webhooks/revenuecat", data=body_of(payload), headers=headers)


def stripe_subscription_event(
    *,
    event_id: str,
    created: int,
    status: str = "active",
    price: str = "pro_monthly",
    sub_id: str = SUB_ID,
    account_id: str | None = STRIPE_ACCOUNT,
    customer: str = CUSTOMER,
    type_: str = "customer.subscription.updated",
) -> dict[str, Any]:
    """A subscription event shaped like the vendored fixture, with the fields a test varies."""
    base = fixture(
        "stripe", "customer.subscription.deleted" if status == "canceled" else "customer.subscription.updated"
    )
    event = copy.deepcopy(base)
    event.update(id=event_id, created=created, type=type_)
    event["data"].pop("previous_attributes", None)
    sub = event["data"]["object"]
    sub.update(
        id=sub_id, status=status, customer=customer, metadata={"account_id": account_id} if account_id else {}
    )
    item = sub["items"]["data"][0]
    item["subscription"] = sub_id
    item["price"].update(id=f"price_{price}", lookup_key=price)
    item["plan"].update(id=f"price_{price}")
    return event


def revenuecat_event(
    name: str, *, event_id: str | None = None, at_ms: int | None = None, **fields: Any
) -> dict[str, Any]:
    event = fixture("revenuecat", name)
    if event_id is not None:
        event["event"]["id"] = event_id
    if at_ms is not None:
        event["event"]["event_timestamp_ms"] = at_ms
    event["event"].update(fields)
    return event


def create_account(client: Any, keys: dict[str, dict[str, str]], account_id: str, **body: Any) -> None:
    r = client.put(f"/v1/accounts/{account_id}", json={"kind": "user", **body}, headers=keys["product"])
    assert r.status_code in (200, 201), r.json


def account(client: Any, keys: dict[str, dict[str, str]], account_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/admin/accounts/{account_id}", headers=keys["admin"])
    assert r.status_code == 200, r.json
    return r.json


def state(client: Any, keys: dict[str, dict[str, str]], account_id: str) -> tuple[str, str, int | None, str]:
    """(plan, status, urls limit, urls limit_source) of the account."""
    a = account(client, keys, account_id)
    urls = a["limits"]["urls"]
    return a["plan"], a["subscription_status"], urls["limit"], urls["limit_source"]


def inbox(conn: Any) -> list[dict[str, Any]]:
    from psycopg.rows import dict_row

    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT id, provider, event_id, type, status, error, note, account_id"
            " FROM webhook_events ORDER BY id"
        ).fetchall()


def now() -> int:
    return int(time.time())

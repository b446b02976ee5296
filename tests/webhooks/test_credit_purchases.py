"""Credits bought by the end customer (issue 25): a paid Stripe checkout session in payment mode that
names a credit pack grants it once (keyed by the session), a refund voids the refunded share of it
forward-only; a RevenueCat NON_RENEWING_PURCHASE of a pack's product grants it once (keyed by the
transaction), its CANCELLATION voids what is left; an unmatched purchase waits for its account.
Stripe's published checkout.session and charge objects (tests/fixtures/stripe/samples) and
RevenueCat's published sample, ids and times substituted; signatures real."""

from __future__ import annotations

import copy
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.conftest import FIXTURES
from tests.webhooks.helpers import create_account, inbox, post_revenuecat, post_stripe

PACK_UNITS = 100  # tests/plans.toml [credit_packs.urls_100]


def _stripe_sample(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "stripe" / "samples" / f"{name}.json").read_text())
    return data


def _session(event_id: str, *, account: str | None, quantity: str | None = "2", paid: bool = True,
             type_: str = "checkout.session.completed", session_id: str = "cs_test_credits_1",
             customer: str | None = None, mode: str = "payment") -> dict[str, Any]:  # fmt: skip
    event = copy.deepcopy(_stripe_sample("checkout.session.fixtures3"))
    event.update(id=event_id, type=type_, created=int(time.time()) - 60)
    metadata = {"credit_pack": "urls_100"} | ({"quantity": quantity} if quantity else {})
    event["data"]["object"].update(
        id=session_id, mode=mode, payment_status="paid" if paid else "unpaid", status="complete",
        client_reference_id=account, customer=customer, metadata=metadata,
        payment_intent="pi_credits_1", created=int(time.time()) - 120,
    )  # fmt: skip
    return event


def _charge(event_id: str, *, amount: int, refunded: int) -> dict[str, Any]:
    event = copy.deepcopy(_stripe_sample("charge.fixtures3"))
    event.update(id=event_id, created=int(time.time()) - 30)
    event["data"]["object"].update(
        payment_intent="pi_credits_1", amount=amount, amount_captured=amount, amount_refunded=refunded,
        refunded=refunded == amount, captured=True,
    )  # fmt: skip
    return event


def _grants(client: Any, keys: Any, account: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/accounts/{account}/grants", headers=keys["product"])
    assert r.status_code == 200, r.json
    return list(r.json["grants"])


def _credits(client: Any, keys: Any, account: str) -> int:
    r = client.get(f"/v1/accounts/{account}", headers=keys["product"])
    return int(r.json["limits"]["urls"]["credits"])


def test_a_paid_checkout_grants_the_pack_once(client, keys, conn):
    create_account(client, keys, "buyer-1")
    unpaid = _session("evt_cs_0", account="buyer-1", paid=False)
    assert post_stripe(client, unpaid).status_code == 200
    assert _grants(client, keys, "buyer-1") == []  # not paid yet: nothing granted

    paid = _session("evt_cs_1", account="buyer-1", type_="checkout.session.async_payment_succeeded")
    assert post_stripe(client, paid).json["status"] == "applied"
    [grant] = _grants(client, keys, "buyer-1")
    assert (grant["units"], grant["remaining"], grant["source"], grant["metric"]) == (
        200,
        200,
        "stripe",
        "urls",
    )
    expires = datetime.fromisoformat(grant["expires_at"])
    assert timedelta(days=364) < expires - datetime.now(UTC) < timedelta(days=366)
    # the same session again (redelivered, or also sent as completed): nothing more
    assert post_stripe(client, paid).json["duplicate"] is True
    again = _session("evt_cs_2", account="buyer-1")
    assert post_stripe(client, again).json["status"] == "applied"
    assert [g["units"] for g in _grants(client, keys, "buyer-1")] == [200]
    assert _credits(client, keys, "buyer-1") == 200
    statuses = [(r["event_id"], r["status"]) for r in inbox(conn)]
    assert statuses == [("evt_cs_0", "ignored"), ("evt_cs_1", "applied"), ("evt_cs_2", "applied")]


def test_refunds_void_the_refunded_share_forward_only(client, keys, conn):
    create_account(client, keys, "buyer-2")
    assert post_stripe(client, _session("evt_cs_3", account="buyer-2", quantity=None)).status_code == 200
    # 30 of the 100 used: 50 over the allowance of 50 (tests/plans.toml free: urls 50) + 30 from credits
    r = client.post(
        "/v1/accounts/buyer-2/takes", json={"metric": "urls", "units": 80}, headers=keys["product"]
    )
    assert (r.status_code, r.json["from_credits"]) == (201, 30)
    # a quarter refunded: 25 units voided (rounded up from 100 * 250/1000)
    assert post_stripe(client, _charge("evt_ch_1", amount=1000, refunded=250)).json["status"] == "applied"
    assert _credits(client, keys, "buyer-2") == 45
    # the running total reaches 251 of 1000: 26 in all, one more
    assert post_stripe(client, _charge("evt_ch_2", amount=1000, refunded=251)).json["status"] == "applied"
    assert _credits(client, keys, "buyer-2") == 44
    # all of it: what is left is voided; the 30 used stay used, nothing goes negative
    assert post_stripe(client, _charge("evt_ch_3", amount=1000, refunded=1000)).json["status"] == "applied"
    assert _credits(client, keys, "buyer-2") == 0
    [grant] = _grants(client, keys, "buyer-2")
    assert (grant["status"], grant["remaining"]) == ("voided", 0)
    used = client.get("/v1/accounts/buyer-2", headers=keys["product"]).json["limits"]["urls"]["used"]
    assert used == 50
    # a charge of another payment: stored, changes nothing
    other = _charge("evt_ch_4", amount=1000, refunded=1000)
    other["data"]["object"]["payment_intent"] = "pi_someone_else"
    assert post_stripe(client, other).json["status"] == "ignored"


def test_an_unmatched_purchase_is_applied_when_its_account_is_created(client, keys, conn):
    assert (
        post_stripe(client, _session("evt_cs_5", account="later-1", quantity="1")).json["status"]
        == "unmatched"
    )
    create_account(client, keys, "later-1")
    assert [g["units"] for g in _grants(client, keys, "later-1")] == [PACK_UNITS]


def test_an_unknown_pack_or_quantity_is_stored_failed_and_grants_nothing(client, keys, conn):
    create_account(client, keys, "buyer-3")
    bad = _session("evt_cs_6", account="buyer-3", quantity="-1", session_id="cs_test_bad_1")
    assert post_stripe(client, bad).json["status"] == "failed"
    unknown = _session("evt_cs_7", account="buyer-3", session_id="cs_test_bad_2")
    unknown["data"]["object"]["metadata"]["credit_pack"] = "nope"
    assert post_stripe(client, unknown).json["status"] == "failed"
    assert _grants(client, keys, "buyer-3") == []


def _rc(event_id: str, type_: str, **fields: Any) -> dict[str, Any]:
    path = FIXTURES / "revenuecat" / "samples" / "non_renewing_purchase.json"
    data: dict[str, Any] = json.loads(path.read_text())
    at = int(time.time() * 1000) - 60_000
    ids = {"app_user_id": "rc-buyer", "original_app_user_id": "rc-buyer", "aliases": []}
    data["event"].update(
        id=event_id, type=type_, event_timestamp_ms=at, purchased_at_ms=at - 1000, product_id="urls.pack.100"
    )
    data["event"].update(ids, **fields)
    return data


def test_a_revenuecat_pack_is_granted_once_and_its_cancellation_voids_the_rest(client, keys, conn):
    create_account(client, keys, "rc-buyer")
    purchase = _rc("rc-p-1", "NON_RENEWING_PURCHASE")
    assert post_revenuecat(client, purchase).json["status"] == "applied"
    again = _rc("rc-p-2", "NON_RENEWING_PURCHASE")  # another delivery of the same transaction
    assert post_revenuecat(client, again).json["status"] == "applied"
    [grant] = _grants(client, keys, "rc-buyer")
    assert (grant["units"], grant["source"]) == (PACK_UNITS, "revenuecat")
    # no plan change: the product is a pack's, not a plan's
    view = client.get("/v1/accounts/rc-buyer", headers=keys["product"]).json
    assert (view["plan"], view["limits"]["urls"]["credits"]) == ("free", PACK_UNITS)
    refund = _rc("rc-c-1", "CANCELLATION", cancel_reason="CUSTOMER_SUPPORT")
    r = post_revenuecat(client, refund)
    assert r.json["status"] == "applied"
    assert [(g["status"], g["remaining"]) for g in _grants(client, keys, "rc-buyer")] == [("voided", 0)]
    # an admin's replay of it (how a refund stored as failed is applied later): nothing more to void
    again = client.post(f"/v1/admin/events/{r.json['id']}/replay", headers=keys["admin"])
    assert (again.status_code, again.json["status"]) == (200, "applied")
    assert [(g["status"], g["remaining"]) for g in _grants(client, keys, "rc-buyer")] == [("voided", 0)]


def test_a_purchase_naming_only_its_customer_waits_for_the_customer_to_be_linked(client, keys, conn):
    purchase = _session("evt_cs_8", account=None, quantity="1", customer="cus_credits_1", session_id="cs_c_1")
    assert post_stripe(client, purchase).json["status"] == "unmatched"
    create_account(client, keys, "buyer-4", stripe_customer_id="cus_credits_1")  # the product links it
    assert [g["units"] for g in _grants(client, keys, "buyer-4")] == [PACK_UNITS]
    # the next purchase of that customer finds the account through the link at once
    later = _session("evt_cs_9", account=None, quantity="1", customer="cus_credits_1", session_id="cs_c_2")
    assert post_stripe(client, later).json["status"] == "applied"
    assert _credits(client, keys, "buyer-4") == 2 * PACK_UNITS

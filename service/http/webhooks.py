"""Webhook endpoints: verify with the provider's adapter, then the delivery pipeline stores and applies.

Refusals (bad signature or auth, malformed body) are answered before anything is stored. A verified
event always gets a 200 once it is stored, whatever became of it: the body says its status.
"""

from __future__ import annotations

import psycopg
from flask import Blueprint, Response, jsonify, request

from service import errors, webhooks
from service.billing import delivery
from service.billing.events import Envelope
from service.errors import InvalidSignature, MalformedWebhook, WebhooksNotConfigured, WebhookUnauthorized
from service.http.errors import refuses
from service.http.metrics import WEBHOOKS
from service.http.runtime import runtime
from service.http.schemas import responses as rs
from service.webhooks import revenuecat, stripe

bp = Blueprint("webhooks", __name__, url_prefix="/webhooks")


def _receive(env: Envelope, *, allowed: bool) -> Response:
    rt = runtime()
    translate = webhooks.translators(rt.settings.webhook_environment)(env.provider)
    with rt.connection() as conn:
        try:
            receipt = delivery.receive(
                conn,
                rt.plans,
                env,
                allowed=allowed,
                translate=translate,
                unmatched_limit=rt.settings.inbox_unmatched_limit,
            )
        except psycopg.DataError:
            # e.g. a NUL in the event id or type, which text refuses: nothing was stored
            raise errors.MalformedWebhook("the body holds JSON the database cannot store") from None
    WEBHOOKS.labels(
        env.provider,
        "duplicate" if receipt.duplicate else receipt.status,
        "locked" if receipt.locked else "one_statement",
    ).inc()
    return jsonify(
        rs.WEBHOOK_RECEIPT.dump(
            {"received": True, "id": receipt.id, "status": receipt.status, "duplicate": receipt.duplicate}
        )
    )


@bp.post("/stripe")
@refuses(InvalidSignature, MalformedWebhook, WebhooksNotConfigured)
def stripe_webhook() -> Response:
    """A Stripe event: verified, stored, applied.
    ---
    post:
      parameters:
        - in: header
          name: Stripe-Signature
          required: true
          description: t=<unix time>,v1=<HMAC-SHA256 of "t.body" with an endpoint secret>; else 400
          schema: {type: string, pattern: "^t=[0-9]+(,v1=[0-9a-f]{64})+$"}
      requestBody: {required: true, content: {application/json: {schema: StripeEvent}}}
      responses:
        200: {description: stored (applied, ignored, unmatched or failed) or a duplicate, content: {application/json: {schema: WebhookReceipt}}}
    """  # noqa: E501
    settings = runtime().settings
    env = stripe.verify(
        request.get_data(), request.headers.get("Stripe-Signature"), settings.stripe_webhook_secrets
    )
    return _receive(env, allowed=env.type in stripe.ALLOWED_TYPES)


@bp.post("/revenuecat")
@refuses(WebhookUnauthorized, MalformedWebhook, WebhooksNotConfigured)
def revenuecat_webhook() -> Response:
    """A RevenueCat event: authenticated, stored, applied.
    ---
    post:
      security: [{revenuecatAuthorization: []}]
      requestBody: {required: true, content: {application/json: {schema: RevenueCatDelivery}}}
      responses:
        200: {description: stored (applied, ignored, unmatched or failed) or a duplicate, content: {application/json: {schema: WebhookReceipt}}}
    """  # noqa: E501
    settings = runtime().settings
    revenuecat.authenticate(request.headers.get("Authorization"), settings.revenuecat_webhook_auth)
    env = revenuecat.parse(request.get_data())
    return _receive(env, allowed=env.type in revenuecat.ALLOWED_TYPES)

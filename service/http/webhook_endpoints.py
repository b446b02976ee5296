"""Admin API for events out (docs/events.md): webhook endpoints and their deliveries."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from service.errors import AlreadyDelivered, EndpointDisabled, InvalidUrl, UnknownDelivery, UnknownEndpoint
from service.events import endpoints
from service.http.auth import actor, require
from service.http.errors import InvalidJson, ValidationFailed, refuses
from service.http.runtime import runtime
from service.http.schemas import requests as rq
from service.http.schemas import responses as rs
from service.http.validation import json_body, query_args

bp = Blueprint("webhook_endpoints", __name__, url_prefix="/v1/admin")


@bp.post("/webhook-endpoints")
@require("admin")
@refuses(InvalidJson, ValidationFailed, InvalidUrl)
def create_endpoint() -> tuple[Response, int]:
    """Add a webhook endpoint for some event types, audited; its secret is answered only here.
    ---
    post:
      requestBody: {required: true, content: {application/json: {schema: WebhookEndpointCreate}}}
      responses:
        201: {description: created, content: {application/json: {schema: WebhookEndpointSecret}}}
    """
    body = json_body(rq.WEBHOOK_ENDPOINT_CREATE)
    rt = runtime()
    with rt.connection() as conn:
        created = endpoints.create(
            conn,
            url=body["url"],
            events=body["events"],
            allow_private=rt.settings.webhook_out_allow_private,
            actor=actor(),
        )
    return jsonify(rs.WEBHOOK_ENDPOINT_SECRET.dump(created)), 201


@bp.get("/webhook-endpoints")
@require("admin")
def list_endpoints() -> Response:
    """The webhook endpoints not deleted, without their secrets.
    ---
    get:
      responses:
        200: {description: the endpoints, content: {application/json: {schema: WebhookEndpoints}}}
    """
    with runtime().connection() as conn:
        items = endpoints.list_endpoints(conn)
    return jsonify(rs.WEBHOOK_ENDPOINTS.dump({"items": items}))


@bp.delete("/webhook-endpoints/<endpoint_id>")
@require("admin")
@refuses(UnknownEndpoint)
def delete_endpoint(endpoint_id: str) -> Response:
    """Delete a webhook endpoint, audited: nothing more is sent to it; again is the same 200.
    ---
    delete:
      responses:
        200: {description: deleted, content: {application/json: {schema: DeleteResponse}}}
    """
    with runtime().connection() as conn:
        endpoints.delete(conn, endpoint_id=endpoint_id, actor=actor())
    return jsonify(rs.DELETED.dump({"id": endpoint_id, "deleted": True}))


@bp.post("/webhook-endpoints/<endpoint_id>/rotate-secret")
@require("admin")
@refuses(UnknownEndpoint)
def rotate_secret(endpoint_id: str) -> Response:
    """A new secret for a webhook endpoint, audited; for 24 h deliveries carry both signatures.
    ---
    post:
      responses:
        200: {description: the new secret, content: {application/json: {schema: WebhookEndpointSecret}}}
    """
    with runtime().connection() as conn:
        rotated = endpoints.rotate(conn, endpoint_id=endpoint_id, actor=actor())
    return jsonify(rs.WEBHOOK_ENDPOINT_SECRET.dump(rotated))


@bp.get("/webhook-endpoints/<endpoint_id>/deliveries")
@require("admin")
@refuses(ValidationFailed, UnknownEndpoint)
def list_deliveries(endpoint_id: str) -> Response:
    """An endpoint's deliveries, newest first, filtered by status; paged.
    ---
    get:
      parameters: [{in: query, schema: DeliveriesQuery}]
      responses:
        200: {description: a page, content: {application/json: {schema: WebhookDeliveriesPage}}}
    """
    args = query_args(rq.DELIVERIES_QUERY)
    before = int(args["cursor"]) if "cursor" in args else None
    with runtime().connection() as conn:
        rows = endpoints.deliveries(
            conn, endpoint_id=endpoint_id, status=args.get("status"), before=before, limit=args["limit"]
        )
    return jsonify(rs.WEBHOOK_DELIVERIES_PAGE.dump(rs.page(rows, args["limit"])))


@bp.post("/webhook-deliveries/<int:delivery_id>/retry")
@require("admin")
@refuses(UnknownDelivery, AlreadyDelivered, EndpointDisabled)
def retry_delivery(delivery_id: int) -> Response:
    """Make a waiting or failed delivery due now (a failed one gets one more attempt).
    ---
    post:
      responses:
        200: {description: the delivery, due now, content: {application/json: {schema: WebhookDelivery}}}
    """
    with runtime().connection() as conn:
        delivery = endpoints.retry(conn, delivery_id=delivery_id)
    return jsonify(rs.WEBHOOK_DELIVERY.dump(delivery))

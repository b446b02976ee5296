"""Admin API for the webhook inbox: list stored events, replay one."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify
from marshmallow import Schema, fields, validate

from service.billing import inbox
from service.errors import UnknownEvent
from service.http import openapi, schemas
from service.http.auth import actor, require
from service.http.inbound import ascii_id
from service.http.runtime import runtime
from service.http.validation import query_args
from service.http.webhooks import translator

bp = Blueprint("events", __name__, url_prefix="/v1/admin/events")

STATUSES = ["applied", "ignored", "unmatched", "failed"]
PROVIDERS = ["stripe", "revenuecat"]


class EventsQuery(schemas.PageQuery):
    status = fields.String(validate=validate.OneOf(STATUSES))
    provider = fields.String(validate=validate.OneOf(PROVIDERS))


class StoredEvent(Schema):
    id = fields.Integer()
    provider = fields.String(metadata={"enum": PROVIDERS})
    event_id = fields.String()
    type = fields.String()
    status = fields.String(metadata={"enum": STATUSES})
    error = fields.String(allow_none=True)
    note = fields.String(allow_none=True, metadata={"description": "stale, unmapped price, moved, ..."})
    account_id = fields.String(allow_none=True)
    subscription_id = fields.String(allow_none=True)
    customer_id = fields.String(allow_none=True)
    occurred_at = fields.String(metadata={"description": "the provider's event time"})
    received_at = fields.String()
    processed_at = fields.String(allow_none=True)
    attempts = fields.Integer(metadata={"description": "1 + replays"})


class EventsPage(Schema):
    items = fields.List(fields.Nested(StoredEvent))
    next_cursor = fields.String(allow_none=True)


def event_json(e: inbox.StoredEvent) -> dict[str, Any]:
    return {
        "id": e.id,
        "provider": e.provider,
        "event_id": e.event_id,
        "type": e.type,
        "status": e.status,
        "error": e.error,
        "received_at": e.received_at.isoformat(),
        "note": e.note,
        "account_id": e.account_id,
        "subscription_id": e.subscription_id,
        "customer_id": e.customer_id,
        "occurred_at": e.occurred_at.isoformat(),
        "processed_at": e.processed_at.isoformat() if e.processed_at else None,
        "attempts": e.attempts,
    }


@bp.get("")
@require("admin")
def list_events() -> Response:
    args = query_args(EventsQuery())
    after, limit = int(args.pop("cursor", 0)), args["limit"]
    with runtime().connection() as conn:
        rows = inbox.page(
            conn, after=after, limit=limit, status=args.get("status"), provider=args.get("provider")
        )
    items = [event_json(e) for e in rows]
    return jsonify({"items": items, "next_cursor": str(items[-1]["id"]) if len(items) == limit else None})


@bp.post("/<inbox_id>/replay")
@require("admin")
def replay_event(inbox_id: str) -> Response:
    # Not <int:...>: an id that names no event is unknown_event, whatever its shape.
    number = ascii_id(inbox_id)
    if number is None:
        raise UnknownEvent(f"no stored webhook event has id {inbox_id!r}")
    rt = runtime()
    with rt.connection() as conn:
        event = inbox.replay(conn, rt.plans, number, translate_for=translator, actor=actor())
    return jsonify(event_json(event))


E = schemas.Error
openapi.register(
    "get",
    "/v1/admin/events",
    "Stored webhook events, oldest first, with next_cursor",
    "admin",
    None,
    {200: EventsPage, 400: E, 401: E, 403: E, 422: E},
)
openapi.register(
    "post",
    "/v1/admin/events/{inbox_id}/replay",
    "Apply a stored webhook event again (e.g. once its account exists)",
    "admin",
    None,
    {200: StoredEvent, 401: E, 403: E, 404: E},
)

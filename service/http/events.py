"""Admin API for the webhook inbox: list stored events, replay one."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from service import webhooks
from service.billing import delivery, inbox
from service.errors import UnknownEvent
from service.http.auth import actor, require
from service.http.errors import ValidationFailed, refuses
from service.http.inbound import ascii_id
from service.http.runtime import runtime
from service.http.schemas import requests as rq
from service.http.schemas import responses as rs
from service.http.validation import query_args

bp = Blueprint("events", __name__, url_prefix="/v1/admin/events")


@bp.get("")
@require("admin")
@refuses(ValidationFailed)
def list_events() -> Response:
    """Stored webhook events, oldest first, filtered by status and provider; paged.
    ---
    get:
      parameters: [{in: query, schema: EventsQuery}]
      responses:
        200: {description: a page, content: {application/json: {schema: EventsPage}}}
    """
    args = query_args(rq.EVENTS_QUERY)
    after, limit = int(args.pop("cursor", 0)), args["limit"]
    with runtime().connection() as conn:
        rows = inbox.page(
            conn, after=after, limit=limit, status=args.get("status"), provider=args.get("provider")
        )
    return jsonify(rs.EVENTS_PAGE.dump(rs.page(rows, limit)))


@bp.post("/<inbox_id>/replay")
@require("admin")
@refuses(UnknownEvent)
def replay_event(inbox_id: str) -> Response:
    """Apply a stored webhook event again (e.g. once its account exists).
    ---
    post:
      responses:
        200: {description: the event after the replay, content: {application/json: {schema: StoredEvent}}}
    """
    # Not <int:...>: an id that names no event is unknown_event, whatever its shape.
    number = ascii_id(inbox_id)
    if number is None:
        raise UnknownEvent(f"no stored webhook event has id {inbox_id!r}")
    rt = runtime()
    with rt.connection() as conn:
        translate_for = webhooks.translators(rt.settings.webhook_environment)
        event = delivery.replay(conn, rt.plans, number, translate_for=translate_for, actor=actor())
    return jsonify(rs.STORED_EVENT.dump(event))

"""Webhook endpoints (admin): create, list, delete, rotate the secret, and their deliveries. Each
change is a definer function that writes its audit row in the same call
(migrations/repeatable/webhooks_out.sql); the secret is returned only by create and rotate."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg.rows import class_row, dict_row

from service.db import Connection, Q
from service.errors import AlreadyDelivered, EndpointDisabled, UnknownDelivery, UnknownEndpoint
from service.events import addresses, signing
from service.vocabulary import DeliveryStatus, EventType

# For how long a rotated secret still signs: receivers roll their secret within it.
ROTATION_GRACE = timedelta(hours=24)
ID_PREFIX = "we_"
_ID = re.compile(r"we_[A-Za-z0-9_-]{1,64}")


def _unknown(endpoint_id: str) -> UnknownEndpoint:
    return UnknownEndpoint(f"no webhook endpoint has id {endpoint_id[:100]!r}")


def _known_shape(endpoint_id: str) -> str:
    """`endpoint_id` if it could be an endpoint's; else UnknownEndpoint, before any query (a NUL, which
    the database refuses, names no endpoint either)."""
    if not _ID.fullmatch(endpoint_id):
        raise _unknown(endpoint_id)
    return endpoint_id


@dataclass(frozen=True)
class Endpoint:
    id: str
    url: str
    events: list[str]
    enabled: bool
    disabled_reason: str | None
    created_at: datetime
    previous_secret_until: datetime | None


@dataclass(frozen=True)
class NewSecret:
    """An endpoint's secret, shown this once: at creation or rotation."""

    id: str
    url: str
    events: list[str]
    enabled: bool
    secret: str
    previous_secret_until: datetime | None = None


@dataclass(frozen=True)
class Delivery:
    id: int
    event_id: int
    type: str
    status: str
    attempts: int
    last_status: int | None
    last_error: str | None
    next_attempt_at: datetime
    created_at: datetime
    finished_at: datetime | None


def create(conn: Connection, *, url: str, events: list[str], allow_private: bool, actor: str) -> NewSecret:
    """A new endpoint subscribed to `events` (EventType values), audited; InvalidUrl when `url` may not
    be one (service/events/addresses.py)."""
    addresses.check(url, allow_private=allow_private)
    types = list(dict.fromkeys(EventType(e).value for e in events))
    endpoint_id, secret = ID_PREFIX + secrets.token_urlsafe(12), signing.new_secret()
    conn.execute(
        Q.endpoint_create, {"id": endpoint_id, "url": url, "events": types, "secret": secret, "actor": actor}
    )
    return NewSecret(id=endpoint_id, url=url, events=types, enabled=True, secret=secret)


def list_endpoints(conn: Connection, *, endpoint_id: str | None = None) -> list[Endpoint]:
    """Every endpoint not deleted (or the one named), oldest first, without secrets."""
    with conn.cursor(row_factory=class_row(Endpoint)) as cur:
        return cur.execute(Q.endpoint_list, {"id": endpoint_id}).fetchall()


def delete(conn: Connection, *, endpoint_id: str, actor: str) -> None:
    """Delete an endpoint, audited; again is a no-op. UnknownEndpoint if it never was."""
    row = conn.execute(Q.endpoint_delete, {"id": _known_shape(endpoint_id), "actor": actor}).fetchone()
    if row is None or row[0] is None:
        raise _unknown(endpoint_id)


def rotate(conn: Connection, *, endpoint_id: str, actor: str) -> NewSecret:
    """A new secret for a live endpoint, audited; the old one signs too for ROTATION_GRACE."""
    secret = signing.new_secret()
    params = {"id": _known_shape(endpoint_id), "secret": secret, "grace": ROTATION_GRACE, "actor": actor}
    with conn.transaction():
        row = conn.execute(Q.endpoint_rotate, params).fetchone()
        until = row[0] if row else None
        if not isinstance(until, datetime):
            raise _unknown(endpoint_id)
        [endpoint] = list_endpoints(conn, endpoint_id=endpoint_id)
    return NewSecret(
        id=endpoint.id,
        url=endpoint.url,
        events=endpoint.events,
        enabled=endpoint.enabled,
        secret=secret,
        previous_secret_until=until,
    )


def deliveries(
    conn: Connection, *, endpoint_id: str, status: DeliveryStatus | None, before: int | None, limit: int
) -> list[Delivery]:
    """A page of an endpoint's deliveries, newest first, ids below `before`; UnknownEndpoint if it
    was never created (a deleted endpoint's deliveries are still listed)."""
    if conn.execute(Q.endpoint_exists, {"id": _known_shape(endpoint_id)}).fetchone() is None:
        raise _unknown(endpoint_id)
    params = {"endpoint_id": endpoint_id, "status": status, "before": before, "limit": limit}
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        return cur.execute(Q.delivery_page, params).fetchall()


def retry(conn: Connection, *, delivery_id: int) -> Delivery:
    """Make a waiting or failed delivery due now (a failed one gets one more attempt). Refused for a
    delivered one (AlreadyDelivered) and one whose endpoint is disabled or deleted."""
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        row = cur.execute(Q.delivery_retry, {"id": delivery_id}).fetchone()
    if row is not None:
        return row
    with conn.cursor(row_factory=dict_row) as cur:
        state = cur.execute(Q.delivery_state, {"id": delivery_id}).fetchone()
    if state is None:
        raise UnknownDelivery(f"no webhook delivery has id {delivery_id}")
    if state["status"] == DeliveryStatus.DELIVERED:
        raise AlreadyDelivered()
    raise EndpointDisabled()

"""The Standard Webhooks signature (standardwebhooks.com), made by the `standardwebhooks` package, the
one receivers verify with: `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` under each secret
that still signs, space-separated (two during a rotation's grace)."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence
from datetime import datetime

from standardwebhooks import Webhook

PREFIX = "whsec_"
SECRET_BYTES = 32  # the floor is 24


def new_secret() -> str:
    """A new endpoint secret: whsec_ and the standard base64 of random bytes, as Standard Webhooks
    libraries read it."""
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def webhook_id(event_id: int) -> str:
    """The event's id as receivers see it (webhook-id): the same at every endpoint and attempt."""
    return f"evt_{event_id}"


def signature(keys: Sequence[str], *, msg_id: str, at: datetime, body: str) -> str:
    """The webhook-signature header: one signature per secret in `keys`, space-separated."""
    return " ".join(Webhook(key).sign(msg_id=msg_id, timestamp=at, data=body) for key in keys)


def headers(keys: Sequence[str], *, msg_id: str, at: datetime, body: str) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt, timestamped `at` (a whole second, UTC)."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature(keys, msg_id=msg_id, at=at, body=body),
    }

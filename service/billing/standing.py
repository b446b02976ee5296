"""Why an account has its plan: its subscriptions, the one it follows (billing_deciding_subscription
decides, in SQL), and the latest provider events about it. Reads only, for the console."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg.rows import class_row

from service.billing.inbox import StoredEvent
from service.db import Connection, Q


@dataclass(frozen=True, kw_only=True)
class Subscription:
    provider: str
    subscription_id: str
    plan: str | None  # None: no price or entitlement of it maps to a plan
    status: str
    final: bool
    event_at: datetime
    event_id: str
    expires_at: datetime | None
    deciding: bool


@dataclass(frozen=True, kw_only=True)
class Standing:
    subscriptions: list[Subscription]
    events: list[StoredEvent]

    @property
    def deciding(self) -> Subscription | None:
        return next((s for s in self.subscriptions if s.deciding), None)


def standing(conn: Connection, *, account_id: str, events: int = 10) -> Standing:
    params = {"account_id": account_id, "limit": events}
    with conn.cursor(row_factory=class_row(Subscription)) as cur:
        subs = cur.execute(Q.standing_subscriptions, params).fetchall()
    with conn.cursor(row_factory=class_row(StoredEvent)) as cur:
        rows = cur.execute(Q.standing_events, params).fetchall()
    return Standing(subscriptions=subs, events=rows)

"""The outbox's fan-out and purge. The events are written into event_outbox by the transaction that
caused them (migrations/0027); the relay turns each into one delivery per endpoint subscribed to its
type, then marks it fanned out, in one transaction, so that an event is fanned out whole or not at
all. Rows are found by `NOT fanned_out`, never by an id cursor."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.rows import class_row

from service.db import Connection, Q

# Serialises fan-out between relays (hex-packed ASCII 'qlfanout'; see
# service.quota.reset.RESET_LOCK_KEY for the registry of fixed keys).
FAN_OUT_LOCK_KEY = 0x716C_6661_6E6F_7574
BATCH = 500


@dataclass(frozen=True)
class Event:
    account_id: str
    id: int
    type: str
    data: dict[str, Any]
    occurred_at: datetime


def body(event: Event) -> str:
    """The Standard Webhooks payload, built once and stored with each delivery: every attempt, at
    every endpoint, sends these bytes."""
    # the database's own rendering of the time (event_emit), so that both read the same
    at = event.data.get("occurred_at") or event.occurred_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return json.dumps({"type": event.type, "timestamp": at, "data": event.data}, separators=(",", ":"))


def fan_out(conn: Connection) -> int | None:
    """Fan out up to BATCH events; returns how many, or None when another relay holds the turn."""
    with conn.transaction():
        # Citus: one connection per worker for the whole transaction, so the read across shards and
        # the per-shard updates that follow never meet on two connections (harmless elsewhere).
        conn.execute("SET LOCAL citus.multi_shard_modify_mode = 'sequential'")
        got = conn.execute(Q.outbox_fan_out_lock, {"key": FAN_OUT_LOCK_KEY}).fetchone()
        if not got or not got[0]:
            return None
        with conn.cursor(row_factory=class_row(Event)) as cur:
            events = cur.execute(Q.outbox_unfanned, {"limit": BATCH}).fetchall()
        if not events:
            return 0
        conn.execute(
            Q.outbox_deliveries,
            {
                "event_ids": [e.id for e in events],
                "account_ids": [e.account_id for e in events],
                "types": [e.type for e in events],
                "bodies": [body(e) for e in events],
                "occurred": [e.occurred_at for e in events],
            },
        )
        by_account: dict[str, list[int]] = defaultdict(list)
        for e in events:
            by_account[e.account_id].append(e.id)
        for account_id, ids in by_account.items():
            conn.execute(Q.outbox_mark_fanned, {"account_id": account_id, "ids": ids})
    return len(events)


@dataclass(frozen=True)
class Purged:
    orphans: int  # waiting deliveries of a disabled or deleted endpoint, failed now
    deliveries: int
    events: int


def purge(conn: Connection, *, keep: timedelta) -> Purged:
    """Fail what waits for an endpoint that is gone, then remove finished deliveries and fanned-out
    events older than `keep` (the retention)."""
    orphans = conn.execute(Q.outbox_fail_orphans).rowcount
    deliveries = conn.execute(Q.outbox_purge_deliveries, {"keep": keep}).rowcount
    events = conn.execute(Q.outbox_purge_events, {"keep": keep}).rowcount
    return Purged(orphans=orphans, deliveries=deliveries, events=events)

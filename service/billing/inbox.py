"""The webhook inbox: every verified provider event, stored once, with what became of it, for as long
as its retention says; the admin listing; what the retention keeps and removes.

Storage only: the delivery pipeline (service/billing/delivery.py) decides what to store and when.
Dedupe is the unique (provider, event_id) constraint with `INSERT ... ON CONFLICT DO NOTHING
RETURNING`, never a lookup.

Retention (docs/design/billing.md "Inbox retention"): applied events are kept for
INBOX_APPLIED_DAYS (0, the default: for ever; finance decides), ignored ones for INBOX_IGNORED_DAYS,
failed ones until an admin replays them, and each provider's unmatched events are bounded to the
newest INBOX_UNMATCHED_LIMIT: the delivery that goes over removes the oldest. A duplicate delivery
stores nothing. Whatever retention removes is counted per provider, status and reason
(webhook_events_purged) and, over the bound, logged with its event ids, so that nothing a provider
sent leaves without a trace (providers resend an event by its id).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from psycopg.rows import class_row, dict_row

from service.billing.events import Envelope
from service.db import Connection, Q, transaction
from service.errors import UnknownEvent
from service.vocabulary import PurgeReason

if TYPE_CHECKING:
    from service.config import Settings

log = logging.getLogger(__name__)

PURGE_BATCH = 5000  # rows per statement: each purge transaction stays short


@dataclass(frozen=True, kw_only=True)
class StoredEvent:
    """An inbox row as support sees it (the payload stays in the database)."""

    id: int
    provider: str
    event_id: str
    type: str
    status: str
    error: str | None
    note: str | None
    account_id: str | None
    subscription_id: str | None
    customer_id: str | None
    occurred_at: datetime
    received_at: datetime
    processed_at: datetime | None
    attempts: int


@dataclass(frozen=True, kw_only=True)
class Retention:
    """How long the inbox keeps what (Settings: INBOX_APPLIED_DAYS, INBOX_IGNORED_DAYS,
    INBOX_UNMATCHED_LIMIT)."""

    applied_days: int  # 0: for ever
    ignored_days: int
    unmatched_limit: int  # per provider

    @classmethod
    def of(cls, settings: Settings) -> Retention:
        return cls(
            applied_days=settings.inbox_applied_days,
            ignored_days=settings.inbox_ignored_days,
            unmatched_limit=settings.inbox_unmatched_limit,
        )


def store(
    conn: Connection, env: Envelope, *, status: str, note: str | None = None, error: str | None = None
) -> int | None:
    """Dedupe and store the row; its id, or None: this (provider, event_id) is stored already."""
    params = {
        "provider": env.provider,
        "event_id": env.event_id,
        "type": env.type,
        "occurred_at": env.occurred_at,
        "payload": env.body,
        "status": status,
        "note": note,
        "error": error,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.inbox_insert, params).fetchone()
    return None if row is None else int(row["id"])


def stored_status(conn: Connection, env: Envelope) -> tuple[int, str] | None:
    """The stored row of `env`'s event (a duplicate's original): its id and status."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.inbox_status, {"provider": env.provider, "event_id": env.event_id}).fetchone()
    return None if row is None else (int(row["id"]), str(row["status"]))


def finish(
    conn: Connection,
    inbox_id: int,
    *,
    status: str,
    account_id: str | None,
    subscription_id: str | None,
    customer_id: str | None,
    note: str | None,
    error: str | None,
    named: tuple[str, ...],
    replay: bool,
) -> None:
    """Write what became of a stored event; an unmatched one keeps the accounts it names, to be
    found when one of them appears."""
    conn.execute(
        Q.inbox_finish,
        {
            "named_accounts": list(named) if named else None,
            "id": inbox_id,
            "status": status,
            "error": error,
            "note": note,
            "account_id": account_id,
            "subscription_id": subscription_id,
            "customer_id": customer_id,
            "replay": 1 if replay else 0,
        },
    )


def mark_failed(conn: Connection, inbox_id: int, error: str) -> None:
    """A replay whose apply failed (and was rolled back): record why."""
    conn.execute(Q.inbox_failed, {"id": inbox_id, "error": error})


def audit_replay(conn: Connection, inbox_id: int, *, actor: str) -> None:
    """An admin's replay is an admin action: one audit row naming `actor`, with what became of the
    event as the replay left its row (audit_event_replayed), in the replay's transaction."""
    conn.execute(Q.inbox_audit_replay, {"id": inbox_id, "actor": actor})


def for_replay(conn: Connection, inbox_id: int) -> tuple[Envelope, datetime]:
    """The stored event, locked until commit (concurrent replays of one event run one after the
    other), as an envelope, and when it was received. UnknownEvent if there is none."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.inbox_for_replay, {"id": inbox_id}).fetchone()
    if row is None:
        raise UnknownEvent(f"no stored webhook event has id {inbox_id}")
    env = Envelope(
        provider=row["provider"],
        event_id=row["event_id"],
        type=row["type"],
        occurred_at=row["occurred_at"],
        body=json.dumps(row["payload"]),
        data=row["payload"],
    )
    return env, row["received_at"]


def waiting(
    conn: Connection,
    *,
    provider: str | None,
    subscription_id: str | None,
    customer_id: str | None,
    account_ids: tuple[str, ...],
) -> list[int]:
    """Stored unmatched events that a new link may make applicable, in provider order."""
    params = {
        "provider": provider,
        "subscription_id": subscription_id,
        "customer_id": customer_id,
        "account_ids": list(account_ids),
    }
    with conn.cursor(row_factory=dict_row) as cur:
        return [int(r["id"]) for r in cur.execute(Q.inbox_waiting, params).fetchall()]


def get(conn: Connection, inbox_id: int) -> StoredEvent:
    with conn.cursor(row_factory=class_row(StoredEvent)) as cur:
        found = cur.execute(Q.inbox_get, {"id": inbox_id}).fetchone()
    if found is None:
        raise UnknownEvent(f"no stored webhook event has id {inbox_id}")
    return found


def payload(conn: Connection, inbox_id: int) -> str:
    """The stored event's body as the provider sent it; UnknownEvent if there is no such row."""
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(Q.inbox_payload, {"id": inbox_id}).fetchone()
    if found is None:
        raise UnknownEvent(f"no stored webhook event has id {inbox_id}")
    return str(found["payload"])


def page(
    conn: Connection,
    *,
    after: int = 0,
    limit: int = 100,
    status: str | None = None,
    provider: str | None = None,
) -> list[StoredEvent]:
    """Inbox rows with id > `after`, oldest first, at most `limit`."""
    with conn.cursor(row_factory=class_row(StoredEvent)) as cur:
        return cur.execute(
            Q.inbox_page, {"after": after, "limit": limit, "status": status, "provider": provider}
        ).fetchall()


# --- retention


@dataclass(frozen=True, kw_only=True)
class PurgeOutcome:
    ignored: int
    applied: int
    over_bound: int

    @property
    def message(self) -> str:
        return (
            f"inbox purge: removed {self.ignored} ignored and {self.applied} applied events past their "
            f"retention, {self.over_bound} unmatched events over the bound"
        )


def bound_unmatched(conn: Connection, provider: str, *, keep: int) -> int:
    """Keep the provider's newest `keep` unmatched events: remove the older ones, count them and log
    their ids (a provider resends an event by its id). Returns how many went. Needs an autocommit
    connection."""
    removed = 0
    while True:
        gone = [
            event_id
            for _, event_id in _remove(
                conn, Q.inbox_over_bound, {"provider": provider, "keep": keep}, reason=PurgeReason.OVER_BOUND
            )
        ]
        if gone:
            log.warning(
                "inbox: %d unmatched %s events over the bound of %d removed (INBOX_UNMATCHED_LIMIT): %s",
                len(gone),
                provider,
                keep,
                ", ".join(gone),
            )
        removed += len(gone)
        if len(gone) < PURGE_BATCH:
            return removed


def purge(
    conn: Connection, retention: Retention, *, providers: tuple[str, ...], at: datetime
) -> PurgeOutcome:
    """Remove what `retention` no longer keeps, as of `at`, in short transactions of at most
    PURGE_BATCH rows each, counting each removal (webhook_events_purged). Safe to run twice and
    beside deliveries. Needs an autocommit connection."""
    params: dict[str, object] = {
        "ignored_before": at - timedelta(days=retention.ignored_days),
        "applied_before": at - timedelta(days=retention.applied_days) if retention.applied_days else None,
    }
    ignored = applied = 0
    while True:
        gone = _remove(conn, Q.inbox_purge, params, reason=PurgeReason.RETENTION)
        ignored += sum(status == "ignored" for status, _ in gone)
        applied += sum(status == "applied" for status, _ in gone)
        if len(gone) < PURGE_BATCH:  # each part removed less than a batch: nothing is left
            break
    over = sum(bound_unmatched(conn, p, keep=retention.unmatched_limit) for p in providers)
    return PurgeOutcome(ignored=ignored, applied=applied, over_bound=over)


def _remove(
    conn: Connection, query: str, params: dict[str, object], *, reason: PurgeReason
) -> list[tuple[str, str]]:
    """Run one removing statement and count what it removed, in one transaction; the status and
    event id of each."""
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query, {**params, "batch": PURGE_BATCH}).fetchall()
        counts: dict[tuple[str, str], list[str]] = {}
        for r in rows:
            counts.setdefault((str(r["provider"]), str(r["status"])), []).append(str(r["event_id"]))
        for (provider, status), ids in counts.items():
            cur.execute(
                Q.inbox_count_purged,
                {
                    "provider": provider,
                    "status": status,
                    "reason": reason.value,
                    "events": len(ids),
                    "last_event_id": ids[-1],
                },
            )
    return [(str(r["status"]), str(r["event_id"])) for r in rows]


@dataclass(frozen=True, kw_only=True)
class Kept:
    """What the inbox holds for one provider and status."""

    provider: str
    status: str
    events: int
    oldest: datetime
    newest: datetime
    payload_bytes: int


@dataclass(frozen=True, kw_only=True)
class Removed:
    """What retention has removed for one provider, status and reason."""

    provider: str
    status: str
    reason: str
    events: int
    last_event_id: str | None
    last_at: datetime


def stats(conn: Connection) -> tuple[list[Kept], list[Removed]]:
    """What the inbox keeps and what its retention has removed (`quota-ledger inbox stats`)."""
    with conn.cursor(row_factory=class_row(Kept)) as cur:
        kept = cur.execute(Q.inbox_stats).fetchall()
    with conn.cursor(row_factory=class_row(Removed)) as cur:
        removed = cur.execute(Q.inbox_purged_counts).fetchall()
    return kept, removed
